"""What a weight transport is, and the two sides it drives.

A transport (one class per way weights travel, as slime's ``update_weight_from_{tensor,distributed,
disk}``) pushes the trainer's current weights into every serving engine (``push``) and into one
relaunched engine (``refresh``). The frame of an update (pause, flush, version, continue, engines
lost mid-way) is the rollout manager's (``RolloutManager.updating``); the transport only moves
bytes: it asks the trainer for them (``WeightSender``: ``TrainerGroup`` offers every transport's
calls; each transport types the part it uses) and posts its own requests.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # engines import sync/ modules without needing these at run time
    import torch

Metrics = dict[str, float]


class NamedWeights(Protocol):
    """The trainer as the CPU transports (disk, tensors) use it."""

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The policy's weights under Hugging Face names, CPU copies."""
        ...


class DiskSender(Protocol):
    """The trainer as the disk transport uses it: rank 0 writes the weights on its own node."""

    def write_weights(self, directory: str | None, model_path: str | None) -> tuple[str, int]:
        """Write the policy's weights as safetensors into ``directory`` (a new scratch directory when
        None), with ``model_path``'s config files; returns (directory, bytes)."""
        ...

    def remove_weights(self, directory: str) -> None: ...


class IpcSender(Protocol):
    """The trainer as the CUDA IPC transport uses it: rank 0 shares its buckets one at a time."""

    def begin_ipc(self, max_bucket_bytes: int, codec: str, cast: str | None) -> tuple[int, int]: ...

    def ipc_bucket_async(self, index: int) -> Any: ...

    def get(self, ref: Any) -> Any: ...

    def end_ipc(self) -> dict[str, float]: ...


class BroadcastSender(Protocol):
    """The trainer as the NCCL transport uses it: rank 0 hosts a weight-update group and broadcasts."""

    def weight_group_address(self) -> tuple[str, int]: ...

    def init_weight_update_group(
        self, address: str, port: int, world_size: int, group_name: str, backend: str
    ) -> Any: ...

    def weight_bucket_specs(self, max_bytes: int, cast: str | None = None) -> list[Any]: ...

    def broadcast_weights(self, specs: list[Any]) -> list[Any]: ...

    def abort_weight_update_group(self) -> None: ...

    def wait(self, refs: list[Any], timeout_s: float | None = None) -> list[Any]: ...

    def close_weight_update_group(self) -> None: ...


class WeightSender(NamedWeights, DiskSender, IpcSender, BroadcastSender, Protocol):
    """Everything a transport may ask of the trainer (``TrainerGroup`` offers it all)."""


class EngineUpdateLike(Protocol):
    """``rollout.engine_update.EngineUpdate`` as the transports use it."""

    urls: list[str]
    tp_sizes: dict[str, int]

    @property
    def live(self) -> list[str]: ...

    def post(self, path: str, body: dict[str, Any] | Callable[[str], dict[str, Any]]) -> None: ...

    def post_each(
        self,
        path: str,
        bodies: Sequence[dict[str, Any]],
        *,
        collective: bool = False,
        on_lost: Callable[[], None] | None = None,
    ) -> None: ...


class RolloutSide(Protocol):
    """What the transports call on the rollout manager."""

    @property
    def membership_epoch(self) -> int:
        """Bumped whenever an engine is relaunched: a weight-update group joined before is stale then."""
        ...

    def updating(
        self, version: int | str | None = None, *, only: str | None = None
    ) -> contextlib.AbstractContextManager[EngineUpdateLike]: ...

    def engine_tp_sizes(self) -> dict[str, int]: ...

    def call_engines(self, path: str, bodies: Mapping[str, dict[str, Any]]) -> dict[str, Any]: ...


class WeightTransport(abc.ABC):
    """Moves weights from the trainer (a ``WeightSender``) into the engines (a ``RolloutSide``)."""

    name: str = ""

    def push(self, trainer: WeightSender, rollout: RolloutSide, version: int | str | None = None) -> Metrics:
        """Every serving engine gets the trainer's weights as ``version`` (None: the next integer);
        returns sync metrics."""
        started = time.perf_counter()
        with rollout.updating(version) as update:
            metrics = self._transfer(trainer, rollout, update)
        seconds = time.perf_counter() - started
        # the frame's own phases (pause + flush, version + continue), where the update recorded them
        metrics.update({f"time/sync_{k}": v for k, v in getattr(update, "seconds", {}).items()})
        size = metrics.get("sync/bytes", 0.0)
        return {
            **metrics,
            "time/sync": seconds,
            "sync/gb_per_s": size / max(seconds, 1e-9) / 1e9,
        }

    def refresh(self, trainer: WeightSender, rollout: RolloutSide, url: str) -> None:
        """The relaunched (unregistered) engine at ``url`` gets the trainer's current weights."""
        with rollout.updating(only=url) as update:
            self._transfer(trainer, rollout, update)

    @abc.abstractmethod
    def _transfer(self, trainer: WeightSender, rollout: RolloutSide, update: EngineUpdateLike) -> Metrics:
        """Move the bytes to ``update``'s engines; metrics (at least ``sync/bytes``)."""

    def close(self) -> None:  # noqa: B027 (optional hook: most transports hold nothing)
        """Free what the transport holds (scratch files, a weight-update group)."""

    def trainer_replaced(self, rollout: RolloutSide) -> None:  # noqa: B027 (optional hook, as close)
        """The trainer group was restarted: forget what was set up with the old one."""


def nbytes(named: Mapping[str, Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in named.values())


@contextlib.contextmanager
def timed(metrics: Metrics, key: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - started
