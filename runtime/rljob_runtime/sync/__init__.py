"""Weight sync from the trainer to the rollout engines.

Every update bumps the weight version and goes pause -> flush (retried) -> transfer -> continue on
each engine (RolloutManager). The transport is chosen by placement and device: on CPU, named
tensors over HTTP (`/update_weights_from_tensor`, rljob's CPU format) or a Hugging Face directory on
disk (`/update_weights_from_disk`). On CUDA, until CUDA IPC (colocated) and NCCL broadcast
(disaggregated) exist, a job on one node uses the disk transport (a safetensors file in /dev/shm);
across nodes it is refused with a clear message.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from rljob_api.spec import RLTrainingJobSpec

Transport = Literal["tensors", "disk", "cuda_ipc", "nccl"]


def choose_transport(spec: RLTrainingJobSpec, *, single_node: bool = False) -> Transport:
    """CPU: a safetensors file in shared memory when everything runs on one node (fastest: no
    encoding, one copy each way), else named tensors over HTTP. GPU: CUDA IPC or NCCL, which do not
    exist yet: on one node the shared-memory file stands in for them (a stop-gap, not the design)."""
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
    if transport in ("cuda_ipc", "nccl"):
        raise NotImplementedError(
            f"weight sync over {transport} (device cuda, engines on other nodes) is not implemented yet; "
            "on cuda use resources.colocate true with one trainer node"
        )


class WeightSync:
    """Pushes the trainer's weights to the engines with the transport chosen for this run."""

    def __init__(self, spec: RLTrainingJobSpec, *, single_node: bool) -> None:
        check_supported(spec, single_node=single_node)
        self.transport = choose_transport(spec, single_node=single_node)
        self._scratch: Path | None = None
        if self.transport == "disk":
            self._scratch = Path(tempfile.mkdtemp(prefix="rljob-weights-", dir="/dev/shm"))

    def push(self, trainer: Any, rollout: Any, version: int) -> dict[str, float]:
        """Send the trainer's current weights to every engine; returns sync metrics."""
        started = time.perf_counter()
        named = trainer.named_tensors()
        size = sum(t.numel() * t.element_size() for t in named.values())
        if self.transport == "disk":
            from safetensors.torch import save_file

            assert self._scratch is not None
            save_file({k: v.contiguous() for k, v in named.items()}, str(self._scratch / "model.safetensors"))
            rollout.update_weights_from_disk(self._scratch, version=version)
        else:
            rollout.update_weights_from_tensors(list(named.items()), version=version)
        seconds = time.perf_counter() - started
        return {
            "time/sync": seconds,
            "sync/bytes": float(size),
            "sync/gb_per_s": size / max(seconds, 1e-9) / 1e9,
        }

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
