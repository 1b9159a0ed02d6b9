"""The hf server's weight endpoints (``HFServer`` mixes them in; the version is read from
``/model_info``, as in SGLang 0.5.16, which answers 404 to ``/get_weight_version``): the loads (from disk, as
tensors in our CPU format or CUDA IPC buckets, from the trainer's NCCL broadcast), the weight-update
group's lifecycle and the exact checksums. Every load runs on the server's one engine thread, after
the batch that is running, and answers with its own phase timings (``timings_ms``, ours)."""

from __future__ import annotations

import asyncio
import base64
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from aiohttp import web

from .. import engine_api
from ..sync import cuda_ipc
from .hf_engine import HFEngine
from .http_util import bad_request, json_or_empty


def decode_named_tensors(data: str, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """One ``serialized_named_tensors`` string: a CUDA IPC bucket (``sync/cuda_ipc.py``; its views
    point into the producer's GPU memory, to be copied out before answering) or rljob's CPU format
    (``engine_api.serialize_named_tensors``)."""
    if load_format == "flattened_bucket":
        raw = base64.b64decode(data)
        if cuda_ipc.is_ipc_payload(raw):
            return cuda_ipc.decode_bucket(raw)
    return engine_api.deserialize_named_tensors(data, load_format)


def load_serialized_tensors(
    engine: HFEngine, data: str, load_format: str | None, timings: dict[str, float] | None = None
) -> int:
    """Load one ``serialized_named_tensors`` string (one TP rank: it holds the full tensors).

    For a CUDA IPC bucket the views point into the trainer's memory: wait for the copies before
    answering (and before dropping the views, which may unmap it), since the trainer frees the
    bucket once the request returns. ``timings``, when given, gets the milliseconds of each phase:
    decode (unpickle, open the IPC handle), copy (queue the copies), sync (wait for them), release."""
    clock = time.perf_counter()

    def mark(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        if timings is not None:
            timings[phase] = round((now - clock) * 1e3, 3)
        clock = now

    named = decode_named_tensors(data, load_format)
    on_gpu = any(t.is_cuda for _, t in named)
    mark("decode_ms")
    count = engine.load_named_tensors(named)
    mark("copy_ms")
    if on_gpu:
        torch.cuda.synchronize()
    mark("sync_ms")
    del named
    mark("release_ms")
    return count


class WeightEndpoints:
    """Mixin of ``HFServer``: what these handlers read and call on it."""

    engine: HFEngine
    executor: ThreadPoolExecutor
    loop: asyncio.AbstractEventLoop | None
    weight_version: str
    update_groups: dict[str, Any]  # group name -> sync.nccl.WeightUpdateGroup

    def _abort(self, rid: str | None) -> int:
        raise NotImplementedError

    async def _run_update(
        self, fn: Any, weight_version: str | None, timings: dict[str, float] | None = None
    ) -> web.Response:
        """``timings``: filled by ``fn``; answered as ``timings_ms`` (ours, not SGLang's), with the
        time the request waited for the executor, so a benchmark can see where an update went."""
        assert self.loop is not None
        queued = time.perf_counter()

        def run() -> Any:
            if timings is not None:
                timings["queue_ms"] = round((time.perf_counter() - queued) * 1e3, 3)
            return fn()

        try:
            count = await self.loop.run_in_executor(self.executor, run)
        except (ValueError, OSError, KeyError, RuntimeError) as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        if weight_version is not None:
            self.weight_version = str(weight_version)
        answer: dict[str, Any] = {
            "success": True,
            "message": f"Succeeded to update {count} tensors.",
            "num_paused_requests": 0,
        }
        if timings is not None:
            answer["timings_ms"] = timings
        return web.json_response(answer)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        model_path = body.get("model_path")
        if not model_path:
            return web.json_response({"success": False, "message": "model_path is required"}, status=400)
        return await self._run_update(
            lambda: self.engine.load_from_disk(str(model_path)), body.get("weight_version")
        )

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        serialized = body.get("serialized_named_tensors")
        if isinstance(serialized, str):
            serialized = [serialized]
        if not serialized or not isinstance(serialized, list):
            return web.json_response(
                {"success": False, "message": "serialized_named_tensors is required"}, status=400
            )
        load_format = body.get("load_format")

        timings: dict[str, float] = {}
        return await self._run_update(
            lambda: load_serialized_tensors(self.engine, serialized[0], load_format, timings),
            body.get("weight_version"),
            timings,
        )

    async def weights_checksum(self, request: web.Request) -> web.Response:
        """rljob's own endpoint (SGLang has none): exact per-tensor checksums of the served weights
        (``sync/checksum.py``), so a test or benchmark can show they equal the trainer's after a sync.
        ``?names=a,b`` limits it to those tensors."""
        from ..sync.checksum import checksums

        wanted = request.query.get("names")
        targets = self.engine.named_weights()
        if wanted:
            unknown = [n for n in wanted.split(",") if n not in targets]
            if unknown:
                return bad_request(f"unknown parameter(s) {unknown[:5]}", status=404)
            targets = {n: targets[n] for n in wanted.split(",")}
        assert self.loop is not None
        sums = await self.loop.run_in_executor(self.executor, lambda: checksums(targets.items()))
        return web.json_response(
            {"weight_version": self.weight_version, "checksums": {k: list(v) for k, v in sums.items()}}
        )

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        if body.get("new_version") is None:
            return bad_request("new_version is required")
        if body.get("abort_all_requests"):
            self._abort(None)
        self.weight_version = str(body["new_version"])
        return web.json_response({"success": True, "message": "ok"})

    # ---- weight-update groups (disaggregated sync, sync/nccl.py) ---------------------------------

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        """Join the trainer's group as rank ``rank_offset`` (this engine is one TP rank). Blocks until
        every member joined, as SGLang's does; the trainer hosts the store as rank 0."""
        from ..sync.nccl import WeightUpdateGroup

        body = await json_or_empty(request)
        missing = [k for k in ("master_address", "master_port", "rank_offset", "world_size") if k not in body]
        if missing:
            return web.json_response({"success": False, "message": f"missing {missing}"}, status=400)
        name = str(body.get("group_name") or "weight_update_group")
        backend = str(body.get("backend") or "nccl")
        if name in self.update_groups:
            return web.json_response({"success": False, "message": f"group {name!r} exists"}, status=400)
        if backend == "nccl" and self.engine.device.type != "cuda":
            return web.json_response(
                {
                    "success": False,
                    "message": f"backend nccl needs a CUDA engine; this one runs on {self.engine.device}",
                },
                status=400,
            )

        def join() -> int:
            self.update_groups[name] = WeightUpdateGroup(
                str(body["master_address"]),
                int(body["master_port"]),
                int(body["rank_offset"]),
                int(body["world_size"]),
                name,
                backend=backend,
                device=self.engine.device,
                timeout_s=float(body.get("timeout_s", 600)),
            )
            return 0

        assert self.loop is not None
        try:
            await self.loop.run_in_executor(self.executor, join)
        except (ValueError, RuntimeError) as exc:  # the store or the communicator could not be reached
            return web.json_response(
                {"success": False, "message": f"failed to join {name!r}: {exc}"}, status=400
            )
        return web.json_response({"success": True, "message": f"joined weight-update group {name!r}"})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """Receive one broadcast from rank 0 and load it: a flattened bucket (one message) or, without
        ``load_format``, one message per tensor (SGLang's default)."""
        from ..sync.nccl import receive, receive_each, spec_from_body

        body = await json_or_empty(request)
        name = str(body.get("group_name") or "weight_update_group")
        group = self.update_groups.get(name)
        if group is None:
            return web.json_response(
                {
                    "success": False,
                    "message": f"group {name!r} not initialised: POST /init_weights_update_group first",
                },
                status=400,
            )
        try:
            spec = spec_from_body(body)
        except (ValueError, TypeError) as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        load_format = body.get("load_format")
        if load_format not in (None, "flattened_bucket"):
            return web.json_response(
                {"success": False, "message": f"load_format {load_format!r}: flattened_bucket or none"},
                status=400,
            )

        version = body.get("weight_version")

        def load() -> int:
            named = receive(group, spec) if load_format else receive_each(group, spec)
            count = self.engine.load_named_tensors(named)
            # Receive and copies are stream-ordered (generation runs after them on the same stream),
            # so a bucket is answered once queued and the next one's broadcast can start meanwhile;
            # the update's last request (the one that moves the version) waits for all of them.
            if version is not None and group.device.type == "cuda":
                torch.cuda.synchronize(group.device)
            return count

        return await self._run_update(load, version)

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        name = str(body.get("group_name") or "weight_update_group")
        group = self.update_groups.pop(name, None)
        if group is None:
            return web.json_response({"success": False, "message": f"no group {name!r}"}, status=400)
        group.close()
        return web.json_response({"success": True, "message": f"left weight-update group {name!r}"})

    def add_weight_routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/update_weights_from_tensor", self.update_weights_from_tensor)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_get("/weights_checksum", self.weights_checksum)
        r.add_post("/init_weights_update_group", self.init_weights_update_group)
        r.add_post("/update_weights_from_distributed", self.update_weights_from_distributed)
        r.add_post("/destroy_weights_update_group", self.destroy_weights_update_group)
