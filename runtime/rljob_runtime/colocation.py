"""Turns on shared GPUs: a colocated job's trainer and engines take the GPUs in turn, as slime's
``--offload`` does, so a model whose trainer and engine do not fit at once still trains on one GPU.

    engines' turn (generate)  ->  to_trainer(): engines release weights, KV cache and CUDA graphs;
                                  the trainer's params, grads and optimizer come back to the GPU
    trainer's turn (train, save)  ->  to_engines(sync): the engines' weights come back, the trainer
                                  pushes its weights into them, the trainer's state goes to CPU,
                                  the engines' KV cache and CUDA graphs come back

Each phase is timed and the GPU memory each side holds after it is recorded (``memory/<phase>/...``,
GB; the engines' side read from NVML by each engine actor). A job that is not colocated has one
phase: the sync. On CPU (the demo) the engines' release is a no-op and the trainer stays in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from .rollout.base import Rollout
    from .trainer.base import TrainerBackend

Metrics = dict[str, float]


class Turns:
    def __init__(self, spec: RLTrainingJobSpec, trainer: TrainerBackend, rollout: Rollout | None) -> None:
        self.colocated = bool(spec.resources.colocate)
        self.offload = self.colocated and spec.resources.device == "cuda"
        # The rollout is set once the engines exist (after ``start``, which makes room for them).
        self.trainer: TrainerBackend = trainer
        self.rollout: Rollout | None = rollout
        # Where the engines' GPU memory is, so a trainer restart in any phase knows what to undo:
        # released for the trainer, and whether their weights came back already (to_engines).
        self.engines_released = False
        self.engine_weights_back = False

    def start(self) -> Metrics:
        """Before the engines exist: the trainer's state leaves the GPU for them."""
        if not self.offload:
            return {}
        metrics: Metrics = {}
        self._phase(metrics, "offload_trainer", self.trainer.offload)
        return metrics

    def to_trainer(self) -> Metrics:
        metrics: Metrics = {}
        if self.colocated:
            self._phase(metrics, "release_engines", self._engines().release_memory)
            self.engines_released, self.engine_weights_back = True, False
        if self.offload:
            self._phase(metrics, "onload_trainer", self.trainer.onload)
        return metrics

    def make_room(self) -> None:
        """Before a restarted trainer group starts: colocated engines that hold the GPU release it,
        so the new ranks can load (``to_engines`` then gives it back, with the reloaded weights)."""
        if self.colocated and not self.engines_released:
            self._engines().release_memory()
            self.engines_released, self.engine_weights_back = True, False

    def to_engines(self, sync: Callable[[], Metrics]) -> Metrics:
        metrics: Metrics = {}
        if self.colocated and not self.engine_weights_back:
            self._phase(metrics, "resume_engine_weights", lambda: self._engines().resume_memory(["weights"]))
            self.engine_weights_back = True
        metrics.update(sync())
        if self.offload:
            self._phase(metrics, "offload_trainer", self.trainer.offload)
        if self.colocated:
            self._phase(
                metrics, "resume_engine_kv", lambda: self._engines().resume_memory(["kv_cache", "cuda_graph"])
            )
            self.engines_released = False
        return metrics

    def _engines(self) -> Rollout:
        if self.rollout is None:
            raise RuntimeError("colocated turns: the engines do not exist yet")
        return self.rollout

    def _phase(self, metrics: Metrics, name: str, action: Callable[[], Any]) -> None:
        started = time.perf_counter()
        action()
        metrics[f"time/{name}"] = time.perf_counter() - started
        if self.offload:
            metrics.update(self.memory(name))

    def after_save(self) -> Metrics:
        """The memory a checkpoint save left (the save stages the trainer's state on the host),
        recorded as the ``save`` phase; nothing when the trainer does not take turns."""
        return self.memory("save") if self.offload else {}

    def memory(self, phase: str) -> Metrics:
        """GB each side holds now. GPU: the trainer ranks' reserved memory (summed), the largest
        rank's peak reserved during the phase, and the engines' processes (summed, from NVML). Host
        (``host_memory``): the trainer ranks' RSS (summed), the largest rank's peak RSS during the
        phase, and the fullest node's or container's used memory against its limit (what the pod's
        limit and Ray's memory monitor act on)."""
        ranks = self.trainer.memory_use()
        trainer = sum(m.get("reserved_gb", 0.0) for m in ranks)
        peak = max((m.get("peak_reserved_gb", 0.0) for m in ranks), default=0.0)
        per_engine = self.rollout.engine_gpu_memory_gb() if self.rollout is not None else []
        engines = sum(per_engine) if all(gb >= 0 for gb in per_engine) else -1.0  # -1: NVML cannot tell
        out = {
            f"memory/{phase}/trainer_gb": trainer,
            f"memory/{phase}/trainer_peak_gb": peak,
            f"memory/{phase}/engines_gb": engines,
        }
        hosts = [m for m in ranks if "host_rss_gb" in m]
        if hosts:
            fullest = max(hosts, key=lambda m: m["host_used_gb"] / max(m["host_limit_gb"], 1e-9))
            out |= {
                f"memory/{phase}/trainer_host_rss_gb": sum(m["host_rss_gb"] for m in hosts),
                f"memory/{phase}/trainer_host_peak_rss_gb": max(m["host_peak_rss_gb"] for m in hosts),
                f"memory/{phase}/host_used_gb": fullest["host_used_gb"],
                f"memory/{phase}/host_limit_gb": fullest["host_limit_gb"],
            }
        return out
