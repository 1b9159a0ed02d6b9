"""Weight updates of the rollout engines, the part of ``RolloutManager`` that talks SGLang's update
endpoints: from disk, as tensors in our CPU format, as CUDA IPC buckets, or by joining the trainer's
NCCL group and receiving its broadcast. Every update pauses, flushes, transfers and continues each
engine; the latest one is remembered (or re-asked of ``weights_provider``) for a relaunched engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import protocol
from .errors import EngineGone, WeightUpdateError

if TYPE_CHECKING:
    from .manager import Engine

NamedTensors = Iterable[tuple[str, Any]] | Mapping[str, Any]  # HF name -> torch.Tensor


@dataclass(frozen=True)
class WeightUpdate:
    """The latest update, replayed onto a relaunched engine."""

    kind: Literal["disk", "tensors", "ipc", "distributed"]
    version: str
    model_path: str | None = None
    serialized: tuple[str, ...] = ()
    load_format: str | None = None
    buckets: tuple[dict[str, Any], ...] = ()  # distributed: one /update_weights_from_distributed body each


class WeightUpdates:
    """Mixin of ``RolloutManager``: its weight updates. The manager provides the state below and
    ``_raise_if_failed``, ``_call``, ``_live``, ``_actor_kwargs``, ``_engine_request`` and
    ``_start_replacement``."""

    engines: list[Engine]
    weight_version: str
    weights_provider: Callable[[], NamedTensors] | None
    membership_epoch: int
    _last_update: WeightUpdate | None
    _weights_lock: asyncio.Lock

    def _next_version(self, version: int | str | None) -> str:
        if version is not None:
            return str(version)
        current = self.weight_version
        return str(int(current) + 1) if current.isdigit() else "1"

    def update_weights_from_disk(self, model_path: str | Path, version: int | str | None = None) -> str:
        """Load an HF directory into every engine; returns the new weight version."""
        self._raise_if_failed()
        update = WeightUpdate("disk", self._next_version(version), model_path=str(model_path))
        return self._call(self._update_all(update))

    def update_weights_from_tensors(
        self, named_tensors: NamedTensors, version: int | str | None = None, *, flattened_bucket: bool = False
    ) -> str:
        """Push named tensors (HF names) to every engine in our CPU wire format; the new version.

        The serialized payload is remembered for relaunched engines unless a ``weights_provider``
        was given (then it is asked again, so no copy of the weights is kept here).
        """
        self._raise_if_failed()
        data = protocol.serialize_named_tensors(named_tensors, flattened_bucket=flattened_bucket)
        update = WeightUpdate(
            "tensors",
            self._next_version(version),
            serialized=(data,),
            load_format="flattened_bucket" if flattened_bucket else None,
        )
        return self._call(self._update_all(update))

    def update_weights_from_ipc(self, payloads: Sequence[str], version: int | str | None = None) -> str:
        """Push CUDA IPC buckets (``sync/cuda_ipc.py``, one request per bucket) to every engine; the
        new version. The handles die with the trainer's buckets, so nothing is kept for relaunched
        engines: they are brought up to date through ``weights_provider`` (CPU format)."""
        self._raise_if_failed()
        update = WeightUpdate(
            "ipc", self._next_version(version), serialized=tuple(payloads), load_format="flattened_bucket"
        )
        return self._call(self._update_all(update))

    # ---- disaggregated sync: the engines join the trainer's NCCL group (sync/nccl.py) ----------

    def weight_group_world_size(self) -> int:
        """The trainer's rank 0 plus one rank per TP rank of every serving engine."""
        return 1 + sum(int(self._actor_kwargs(e.index)["tp_size"]) for e in self._live())

    def join_weights_update_group(
        self, address: str, port: int, world_size: int, group_name: str, backend: str = "nccl"
    ) -> int:
        """Ask every serving engine to join the group hosted at ``address:port`` (they block until the
        trainer's rank 0 joins too, so call this while it does); returns ``membership_epoch``."""
        self._raise_if_failed()
        return self._call(self._join_group(address, port, world_size, group_name, backend))

    async def _join_group(
        self, address: str, port: int, world_size: int, group_name: str, backend: str
    ) -> int:
        epoch = self.membership_epoch
        engines, offset, bodies = self._live(), 1, []
        for engine in engines:
            bodies.append(
                protocol.init_weights_update_group_body(
                    master_address=address,
                    master_port=port,
                    rank_offset=offset,
                    world_size=world_size,
                    group_name=group_name,
                    backend=backend,
                )
            )
            offset += int(self._actor_kwargs(engine.index)["tp_size"])
        if offset != world_size:
            raise WeightUpdateError(f"the group has {world_size} ranks but the engines need {offset}")
        results = await asyncio.gather(
            *(
                self._expect(e.url, "POST", "/init_weights_update_group", b)
                for e, b in zip(engines, bodies, strict=True)
            ),
            return_exceptions=True,
        )
        errors = [
            f"engine {e.index}: {r}"
            for e, r in zip(engines, results, strict=True)
            if isinstance(r, BaseException)
        ]
        if errors:
            raise WeightUpdateError(f"joining weight-update group {group_name!r} failed: {'; '.join(errors)}")
        return epoch

    def leave_weights_update_group(self, group_name: str) -> None:
        """Best effort (engines that died with the group are gone anyway)."""

        async def leave(engine: Engine) -> None:
            with contextlib.suppress(EngineGone, WeightUpdateError):
                await self._expect(
                    engine.url,
                    "POST",
                    "/destroy_weights_update_group",
                    protocol.destroy_weights_update_group_body(group_name),
                )

        async def leave_all() -> None:
            await asyncio.gather(*(leave(e) for e in self._live()))

        self._call(leave_all())

    def update_weights_from_distributed(
        self, buckets: Sequence[dict[str, Any]], version: int | str | None = None
    ) -> str:
        """Tell every engine to receive ``buckets`` (``/update_weights_from_distributed`` bodies, in
        the order the trainer broadcasts them, which it does meanwhile); the new version. Like IPC,
        nothing is kept for relaunched engines: ``weights_provider`` brings them up to date."""
        self._raise_if_failed()
        update = WeightUpdate("distributed", self._next_version(version), buckets=tuple(buckets))
        return self._call(self._update_all(update))

    async def _update_all(self, update: WeightUpdate) -> str:
        async with self._weights_lock:
            self.weight_version = update.version
            keep = update if update.kind == "disk" or self.weights_provider is None else None
            if update.kind in ("ipc", "distributed"):
                keep = None  # handles die with the trainer's buckets; a broadcast cannot be replayed
            self._last_update = keep or WeightUpdate("tensors", update.version)
            engines = [e for e in self.engines if e.state == "serving"]
            for engine in engines:
                engine.state = "updating"
            results = await asyncio.gather(
                *(self._update_engine(e.url, update) for e in engines), return_exceptions=True
            )
            errors = []
            for engine, result in zip(engines, results, strict=True):
                if isinstance(result, EngineGone):
                    # dead mid-update: its replacement (after we release the lock) gets this version
                    self._start_replacement(engine, f"weight update failed: {result}")
                elif isinstance(result, BaseException):
                    engine.state = "serving"
                    errors.append(f"engine {engine.index}: {result}")
                else:
                    engine.state = "serving"
            if errors:
                raise WeightUpdateError(
                    f"weight update to version {update.version} failed: {'; '.join(errors)}"
                )
        self._raise_if_failed()
        return update.version

    async def _update_engine(self, url: str, update: WeightUpdate) -> None:
        """pause_generation, flush_cache (until 200), transfer, continue_generation."""
        await self._expect(url, "POST", "/pause_generation", protocol.pause_body())
        try:
            for _ in range(120):
                status, _answer = await self._engine_request(url, "GET", "/flush_cache", timeout=30)
                if status == 200:
                    break
                await asyncio.sleep(0.5)
            else:
                raise WeightUpdateError(f"{url}/flush_cache still refused after 60 s")
            if update.kind == "disk":
                assert update.model_path is not None
                body = protocol.update_weights_from_disk_body(
                    update.model_path, weight_version=update.version
                )
                await self._expect(url, "POST", "/update_weights_from_disk", body)
            elif update.kind == "ipc":
                # one bucket per request (one TP rank each); the version moves with the last one
                for i, payload in enumerate(update.serialized):
                    last = i == len(update.serialized) - 1
                    body = protocol.update_weights_from_tensor_body(
                        [payload],
                        load_format=update.load_format,
                        weight_version=update.version if last else None,
                    )
                    await self._expect(url, "POST", "/update_weights_from_tensor", body)
            elif update.kind == "distributed":
                # each request returns once its bucket arrived from the trainer's broadcast and loaded
                for i, bucket in enumerate(update.buckets):
                    last = i == len(update.buckets) - 1
                    body = {k: v for k, v in bucket.items() if k != "weight_version"}
                    if last:
                        body["weight_version"] = update.version
                    await self._expect(url, "POST", "/update_weights_from_distributed", body)
            else:
                body = protocol.update_weights_from_tensor_body(
                    list(update.serialized), load_format=update.load_format, weight_version=update.version
                )
                await self._expect(url, "POST", "/update_weights_from_tensor", body)
        finally:
            await self._expect(url, "POST", "/continue_generation", {})

    async def _expect(self, url: str, method: str, path: str, body: Any) -> Any:
        status, answer = await self._engine_request(url, method, path, body)
        if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
            raise WeightUpdateError(f"{method} {url}{path}: HTTP {status} {answer}")
        return answer

    def _provided_weights(self) -> list[tuple[str, Any]]:
        """``weights_provider``'s tensors as pairs (it may return a mapping, as the trainer does)."""
        assert self.weights_provider is not None
        named = self.weights_provider()
        return list(named.items() if isinstance(named, Mapping) else named)

    async def _push_current_weights(self, url: str) -> None:
        """Bring a relaunched engine (not yet registered) to the current weight version."""
        update = self._last_update
        if update is None:
            return  # never updated: the relaunched engine loaded the initial weights
        if update.kind == "tensors" and not update.serialized:
            assert self.weights_provider is not None
            named = await asyncio.to_thread(self._provided_weights)
            data = await asyncio.to_thread(protocol.serialize_named_tensors, named)
            update = WeightUpdate("tensors", update.version, serialized=(data,))
        await self._update_engine(url, update)
