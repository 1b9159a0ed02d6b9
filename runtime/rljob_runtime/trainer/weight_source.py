"""The trainer's side of weight sync, shared by both backends: CUDA IPC buckets (colocated,
``sync/cuda_ipc.py``), NCCL broadcast (disaggregated, ``sync/nccl.py``) and CPU copies (disk and
the CPU tensor format). The transports (``sync/``) drive these through ``TrainerGroup``.

A backend rank mixes this in and provides ``device_weights()``: its policy under HF names on its own
device, whole, on the rank that sends (global rank 0) and ``{}`` elsewhere. For megatron that is a
collective of data-parallel rank 0's TP x PP ranks (TP gather, PP merge) and, for an MoE model at
expert parallel size > 1, of their EP peers (the expert gather), so the group calls the exporting
methods on all of them (the ranks whose ``layout()`` says ``exports_weights``). Only global rank 0 shares buckets or joins the weight-update group.
A rank whose state is offloaded (colocated runs) makes its weights resident for an export
(``weights_resident``, provided by the backend).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from typing import Any

import torch

from ..net import free_port, node_ip
from ..sync.buckets import plan_buckets, target_dtype
from ..sync.cuda_ipc import Codec, IpcProducer
from ..sync.disk import write_weights_dir
from ..sync.nccl import BucketSpec, NcclSender, WeightUpdateGroup, bucket_specs


class WeightSource:
    rank: int
    _update_group: WeightUpdateGroup | None = None
    _ipc: IpcProducer | None = None
    _ipc_stack: contextlib.ExitStack | None = None
    _aborted: threading.Event | None = None

    def device_weights(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def weights_resident(self) -> contextlib.AbstractContextManager[Any]:
        """The policy's weights on the GPU for as long as the context lasts (backends that offload
        override this)."""
        return contextlib.nullcontext()

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """``device_weights`` as CPU copies (the CPU and disk transports, relaunched engines)."""
        with self.weights_resident():
            return {k: v.to("cpu", copy=True) for k, v in self.device_weights().items()}

    def write_weights(self, directory: str | None, model_path: str | None) -> tuple[str, int]:
        """The disk transport's export: global rank 0 writes ``named_tensors`` into a scratch
        directory on its node (``sync/disk.py``); the other exporting ranks join the collective."""
        named = self.named_tensors()
        if self.rank != 0:
            return "", 0
        return write_weights_dir(named, directory, model_path)

    def remove_weights(self, directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)

    # ---- CUDA IPC (colocated) --------------------------------------------------------------------

    def begin_ipc(self, max_bucket_bytes: int, codec: Codec, cast: str | None = None) -> tuple[int, int]:
        """Export the weights (a collective of the replica's ranks) and plan the buckets; rank 0 keeps
        the export until ``end_ipc``. Returns (buckets, bytes) on rank 0, (0, 0) elsewhere."""
        self.end_ipc()
        stack = contextlib.ExitStack()
        stack.enter_context(self.weights_resident())
        weights = self.device_weights()
        if self.rank != 0:
            stack.close()
            return 0, 0
        dtype = getattr(torch, cast) if cast else None
        plan = plan_buckets(weights.items(), max_bucket_bytes, dtype)
        self._ipc, self._ipc_stack = IpcProducer(plan, codec, dtype), stack
        total = sum(t.numel() * target_dtype(t, dtype).itemsize for items in plan for _, t in items)
        return len(plan), total

    def ipc_bucket(self, index: int) -> str:
        """Bucket ``index``'s payload (rank 0); frees bucket ``index - 2`` (see ``IpcProducer``)."""
        if self._ipc is None:
            raise RuntimeError("ipc_bucket before begin_ipc")
        return self._ipc.share(index)

    def end_ipc(self) -> dict[str, float]:
        """Free the buckets and the export; the sync's bytes (rank 0)."""
        producer, stack = self._ipc, self._ipc_stack
        self._ipc = self._ipc_stack = None
        if producer is not None:
            producer.release()
        if stack is not None:
            stack.close()
        return {"bytes": float(producer.nbytes) if producer is not None else 0.0}

    # ---- NCCL broadcast (disaggregated) -------------------------------------------------------------

    def weight_group_address(self) -> tuple[str, int]:
        """Where this rank (global 0) will host the group's store: its node IP and a free port."""
        return node_ip(), free_port()

    def init_weight_update_group(
        self, address: str, port: int, world_size: int, group_name: str, backend: str = "nccl"
    ) -> None:
        """Host the group as rank 0; returns once every engine joined (they are asked concurrently)."""
        self.close_weight_update_group()
        self._aborted = threading.Event()
        self._update_group = WeightUpdateGroup(address, port, 0, world_size, group_name, backend=backend)

    def weight_bucket_specs(self, max_bytes: int, cast: str | None = None) -> list[BucketSpec]:
        """The send plan (names, dtypes, shapes per bucket) on rank 0; [] on the other ranks."""
        with self.weights_resident():
            weights = self.device_weights()
            dtype = getattr(torch, cast) if cast else None
            return bucket_specs(weights.items(), max_bytes, dtype) if self.rank == 0 else []

    def broadcast_weights(self, specs: list[BucketSpec]) -> dict[str, Any]:
        """Send every bucket in ``specs`` order (the engines receive in the same order)."""
        with self.weights_resident():
            weights = self.device_weights()
            if self.rank != 0:
                return {"bytes": 0}
            if self._update_group is None:
                raise RuntimeError("broadcast_weights before init_weight_update_group")
            missing = [n for s in specs for n in s.names if n not in weights]
            if missing:
                raise ValueError(f"the send plan names tensors this rank does not hold: {missing[:5]}")
            sent = NcclSender(self._update_group).send(weights, specs)
        if self._aborted is not None and self._aborted.is_set():
            raise RuntimeError("the weight broadcast was aborted: an engine left the group mid-transfer")
        return {"bytes": sent}

    def abort_weight_update_group(self) -> None:
        """Abort the group from another thread while a broadcast waits on a dead engine (the rank's
        "control" concurrency group runs this beside ``broadcast_weights``): NCCL's kernels exit, the
        broadcast returns and raises, instead of waiting for the group's timeout."""
        if self._aborted is not None:
            self._aborted.set()
        group = self._update_group
        if group is not None:
            group.close()

    def close_weight_update_group(self) -> None:
        group, self._update_group = self._update_group, None
        if group is not None:
            group.close()
