"""Weight sync from the trainer to the rollout engines.

Every update bumps the weight version and goes pause -> flush (retried) -> transfer -> continue on
each engine (RolloutManager). The transport is chosen by placement and device: on CPU, named
tensors over HTTP (`/update_weights_from_tensor`, rljob's CPU format) or a Hugging Face directory on
disk (`/update_weights_from_disk`); CUDA IPC (colocated) and NCCL broadcast (disaggregated) belong
to the GPU work and are refused here with a clear message until they exist.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from rljob_api.spec import RLTrainingJobSpec

Transport = Literal["tensors", "disk", "cuda_ipc", "nccl"]


def choose_transport(spec: RLTrainingJobSpec) -> Transport:
    if spec.resources.device == "cpu":
        return "tensors"
    return "cuda_ipc" if spec.resources.colocate else "nccl"


def check_supported(spec: RLTrainingJobSpec) -> None:
    transport = choose_transport(spec)
    if transport in ("cuda_ipc", "nccl"):
        raise NotImplementedError(
            f"weight sync over {transport} (device cuda) is not implemented yet; use resources.device cpu"
        )


def push_weights(
    spec: RLTrainingJobSpec, trainer: Any, rollout: Any, version: int, scratch: Path | None = None
) -> dict[str, float]:
    """Send the trainer's current weights to every engine; returns sync metrics."""
    started = time.perf_counter()
    transport = choose_transport(spec)
    if transport == "tensors":
        named = trainer.named_tensors()
        size = sum(t.numel() * t.element_size() for t in named.values())
        rollout.update_weights_from_tensors(list(named.items()), version=version)
    elif transport == "disk":
        assert scratch is not None
        trainer.save(str(scratch))
        size = sum(f.stat().st_size for f in (scratch / "model").glob("*.safetensors"))
        rollout.update_weights_from_disk(scratch / "model", version=version)
    else:
        check_supported(spec)
        raise AssertionError("unreachable")
    seconds = time.perf_counter() - started
    return {"time/sync": seconds, "sync/bytes": float(size), "sync/gb_per_s": size / max(seconds, 1e-9) / 1e9}
