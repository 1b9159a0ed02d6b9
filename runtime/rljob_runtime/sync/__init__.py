"""Weight sync from the trainer to the rollout engines.

Every update bumps the weight version and goes pause -> flush (retried) -> transfer -> continue on
each engine (RolloutManager). The transport is chosen by placement and device: on CPU, named
tensors over HTTP (`/update_weights_from_tensor`, rljob's CPU format) or a Hugging Face directory on
disk (`/update_weights_from_disk`). On CUDA, colocated on one node: CUDA IPC (`cuda_ipc.py`; the
trainer's rank 0 shares flattened GPU buckets, each engine copies them into its parameters, then
the trainer frees them). Otherwise on one node (not colocated, or a backend without IPC export:
megatron) a safetensors file in /dev/shm; across nodes (NCCL broadcast, not written yet) it is
refused with a clear message.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # lazily: engines import sync.cuda_ipc without the API package
    from rljob_api.spec import RLTrainingJobSpec

Transport = Literal["tensors", "disk", "cuda_ipc", "nccl"]


def choose_transport(spec: RLTrainingJobSpec, *, single_node: bool = False) -> Transport:
    """CPU: a safetensors file in shared memory when everything runs on one node (fastest: no
    encoding, one copy each way), else named tensors over HTTP. GPU: CUDA IPC when colocated on one
    node; NCCL (not written yet) otherwise, for which the shared-memory file stands in on one node."""
    if spec.resources.device == "cuda" and spec.resources.colocate and single_node:
        return "cuda_ipc"
    if spec.resources.device == "cpu" or single_node:
        return "disk" if single_node and Path("/dev/shm").is_dir() else "tensors"
    return "cuda_ipc" if spec.resources.colocate else "nccl"


def check_supported(spec: RLTrainingJobSpec, *, single_node: bool | None = None) -> None:
    """Refuse what cannot sync: on cuda, a job spanning nodes (``single_node`` None: judged from the
    spec's trainer nodes, before Ray starts)."""
    if spec.resources.device != "cuda":
        return
    if single_node is None:
        single_node = spec.resources.trainer.nodes == 1 and spec.resources.colocate
    transport = choose_transport(spec, single_node=single_node)
    if transport == "nccl" or (transport == "cuda_ipc" and not single_node):
        raise NotImplementedError(
            f"weight sync over {transport} (device cuda, engines on other nodes) is not implemented yet; "
            "on cuda use resources.colocate true with one trainer node"
        )


class WeightSync:
    """Pushes the trainer's weights to the engines with the transport chosen for this run."""

    def __init__(self, spec: RLTrainingJobSpec, *, single_node: bool, bucket_bytes: int = 1 << 30) -> None:
        check_supported(spec, single_node=single_node)
        self.transport: Transport = choose_transport(spec, single_node=single_node)
        self.bucket_bytes = bucket_bytes
        self._scratch: Path | None = None

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="rljob-weights-", dir="/dev/shm"))
        return self._scratch

    def push(self, trainer: Any, rollout: Any, version: int) -> dict[str, float]:
        """Send the trainer's current weights to every engine; returns sync metrics."""
        started = time.perf_counter()
        if self.transport == "cuda_ipc" and getattr(trainer, "supports_cuda_ipc", False):
            return self._push_ipc(trainer, rollout, version, started)
        named = trainer.named_tensors()
        size = sum(t.numel() * t.element_size() for t in named.values())
        if self.transport in ("disk", "cuda_ipc"):  # cuda_ipc here: the backend cannot export by IPC
            from safetensors.torch import save_file

            scratch = self._scratch_dir()
            save_file({k: v.contiguous() for k, v in named.items()}, str(scratch / "model.safetensors"))
            rollout.update_weights_from_disk(scratch, version=version)
        else:
            rollout.update_weights_from_tensors(list(named.items()), version=version)
        seconds = time.perf_counter() - started
        return {
            "time/sync": seconds,
            "sync/bytes": float(size),
            "sync/gb_per_s": size / max(seconds, 1e-9) / 1e9,
        }

    def _push_ipc(self, trainer: Any, rollout: Any, version: int, started: float) -> dict[str, float]:
        payloads, size = trainer.share_weights_ipc(self.bucket_bytes)
        shared = time.perf_counter()
        try:
            rollout.update_weights_from_ipc(payloads, version=version)
        finally:
            trainer.release_weights_ipc()  # only now: the engines have copied (or failed)
        seconds = time.perf_counter() - started
        return {
            "time/sync": seconds,
            "time/sync_share": shared - started,  # flatten + handles, on the trainer rank
            "sync/bytes": float(size),
            "sync/gb_per_s": size / max(seconds, 1e-9) / 1e9,
            "sync/buckets": float(len(payloads)),
        }

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
