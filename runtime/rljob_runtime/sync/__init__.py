"""Weight sync from the trainer to the rollout engines.

Every update bumps the weight version and goes pause -> flush (retried) -> transfer -> continue on
each engine (RolloutManager). The transport is chosen by placement and device: on CPU, named
tensors over HTTP (`/update_weights_from_tensor`, rljob's CPU format) or a Hugging Face directory on
disk (`/update_weights_from_disk`). On CUDA, colocated on one node: CUDA IPC (`cuda_ipc.py`; the
trainer's rank 0 shares flattened GPU buckets, each engine copies them into its parameters, then
the trainer frees them). On CUDA with the engines on GPUs of their own (one node or several): NCCL
broadcast (`nccl.py`; rank 0 hosts a group with every engine rank and broadcasts flattened buckets
while the engines receive them through `/update_weights_from_distributed`). Colocated across nodes
is refused with a clear message (an engine sharing a GPU with a trainer rank cannot join its NCCL
group, and IPC does not cross nodes).

The NCCL group is built at the first push and rebuilt when an engine was relaunched since
(`RolloutManager.membership_epoch`); a relaunched engine gets the current weights in the CPU format
first. An engine that dies *during* a broadcast leaves the trainer waiting until the group's
timeout, then the push fails (the run fails and resumes from its last checkpoint).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .buckets import DEFAULT_BUCKET_BYTES
from .cuda_ipc import IPC_BUCKET_BYTES

if TYPE_CHECKING:  # lazily: engines import sync.cuda_ipc without the API package
    from rljob_api.spec import RLTrainingJobSpec

Transport = Literal["tensors", "disk", "cuda_ipc", "nccl"]


def choose_transport(spec: RLTrainingJobSpec, *, single_node: bool = False) -> Transport:
    """CPU: a safetensors file in shared memory when everything runs on one node (fastest: no
    encoding, one copy each way), else named tensors over HTTP. GPU: CUDA IPC when colocated (on one
    node: ``check_supported`` refuses more), NCCL broadcast when the engines have GPUs of their own."""
    if spec.resources.device == "cuda":
        return "cuda_ipc" if spec.resources.colocate else "nccl"
    return "disk" if single_node and Path("/dev/shm").is_dir() else "tensors"


def check_supported(spec: RLTrainingJobSpec, *, single_node: bool | None = None) -> None:
    """Refuse what cannot sync: on cuda, colocated across nodes (``single_node`` None: judged from
    the spec's trainer nodes, before Ray starts)."""
    if spec.resources.device != "cuda" or not spec.resources.colocate:
        return
    if single_node is None:
        single_node = spec.resources.trainer.nodes == 1
    if not single_node:
        raise NotImplementedError(
            "weight sync for resources.colocate true across nodes is not implemented: CUDA IPC does not "
            "cross nodes, and an engine sharing a GPU with a trainer rank cannot join its NCCL group; use "
            "one trainer node, or resources.colocate false (engines on their own GPUs, synced by NCCL)"
        )


class WeightSync:
    """Pushes the trainer's weights to the engines with the transport chosen for this run.

    ``transport`` and ``group_backend`` override the choice for tests: ``group_backend="gloo"`` runs
    the NCCL protocol between CPU processes."""

    def __init__(
        self,
        spec: RLTrainingJobSpec,
        *,
        single_node: bool,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        ipc_bucket_bytes: int = IPC_BUCKET_BYTES,
        transport: Transport | None = None,
        group_backend: str = "nccl",
    ) -> None:
        check_supported(spec, single_node=single_node)
        self.transport: Transport = transport or choose_transport(spec, single_node=single_node)
        self.bucket_bytes = bucket_bytes  # NCCL buckets: two in flight on the trainer's GPU
        self.ipc_bucket_bytes = ipc_bucket_bytes  # see cuda_ipc.IPC_BUCKET_BYTES
        self.group_backend = group_backend
        self._scratch: Path | None = None
        self._group_name: str | None = None
        self._group_epoch = -1
        self._groups_made = 0
        self._specs: list[Any] | None = None

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="rljob-weights-", dir="/dev/shm"))
        return self._scratch

    def push(self, trainer: Any, rollout: Any, version: int) -> dict[str, float]:
        """Send the trainer's current weights to every engine; returns sync metrics."""
        started = time.perf_counter()
        if self.transport == "cuda_ipc" and getattr(trainer, "supports_cuda_ipc", False):
            return self._push_ipc(trainer, rollout, version, started)
        if self.transport == "nccl":
            return self._push_broadcast(trainer, rollout, version, started)
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
        payloads, size = trainer.share_weights_ipc(self.ipc_bucket_bytes)
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

    def _ensure_group(self, trainer: Any, rollout: Any) -> float:
        """Build the weight-update group (again, if an engine was relaunched since); seconds spent."""
        if self._group_name is not None and self._group_epoch == rollout.membership_epoch:
            return 0.0
        started = time.perf_counter()
        if self._group_name is not None:
            trainer.close_weight_update_group()
            rollout.leave_weights_update_group(self._group_name)
        self._groups_made += 1
        name = f"rljob-weights-{self._groups_made}"
        address, port = trainer.weight_group_address()
        world = rollout.weight_group_world_size()
        hosting = trainer.init_weight_update_group(address, port, world, name, self.group_backend)
        epoch = rollout.join_weights_update_group(address, port, world, name, self.group_backend)
        trainer.wait([hosting])
        self._group_name, self._group_epoch = name, epoch
        return time.perf_counter() - started

    def _push_broadcast(self, trainer: Any, rollout: Any, version: int, started: float) -> dict[str, float]:
        group_s = self._ensure_group(trainer, rollout)
        if self._specs is None:  # names, shapes and dtypes do not change during a run
            self._specs = trainer.weight_bucket_specs(self.bucket_bytes)
        assert self._group_name is not None
        bodies = [spec.body(self._group_name) for spec in self._specs]
        sending = trainer.broadcast_weights(self._specs)
        try:
            rollout.update_weights_from_distributed(bodies, version=version)
        except BaseException:
            self._group_epoch = -1  # the group's state is unknown now: leave it and build anew next time
            raise
        size = trainer.wait(sending)[0]["bytes"]
        seconds = time.perf_counter() - started
        return {
            "time/sync": seconds,
            "time/sync_group_init": group_s,
            "sync/bytes": float(size),
            "sync/gb_per_s": size / max(seconds - group_s, 1e-9) / 1e9,
            "sync/buckets": float(len(bodies)),
        }

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
