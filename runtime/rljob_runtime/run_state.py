"""What a checkpoint holds of the run beyond the trainer's own files, and how the run saves and
restores it: the step, the data-source position, the driver's RNG, async mode's rollouts made
ahead of the trainer and partial rollout's carried groups (``driver.json``, through
``checkpoint.store``). Saved on interval and after a SIGTERM (the preemption save); restored when
a run resumes and when a trainer restart goes back to the latest checkpoint.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import preemption
from .checkpoint import store
from .checkpoint.errors import CheckpointWriteError
from .data.sample import Sample
from .run_error import RunError
from .step_rollout import StepRollout

if TYPE_CHECKING:
    from .colocation import Turns
    from .prepare import Prepared
    from .rollouts_ahead import StepRollouts
    from .trainer.base import TrainerBackend

log = logging.getLogger("rljob.driver")  # the run's logger, the loop's too


def save_checkpoint(
    prepared: Prepared, trainer: TrainerBackend, step: int, rng: random.Random, buffers: list[StepRollout]
) -> Path | None:
    """Save step ``step``. A failed write (disk full, quota, I/O error) leaves the previous checkpoint
    as the latest and training goes on, except for the last step's save, which the run needs."""
    try:
        return _save(prepared, trainer, Path(prepared.spec.checkpoint.path), step, rng, buffers)
    except CheckpointWriteError as err:
        if step == prepared.spec.training.num_rollout:
            raise
        print(f"checkpoint of step {step} failed, training goes on: {err}", flush=True)
        log.warning("checkpoint of step %d failed: %s", step, err)
        return None


def _save(
    prepared: Prepared,
    trainer: TrainerBackend,
    root: Path,
    step: int,
    rng: random.Random,
    buffers: list[StepRollout],
) -> Path:
    """Written into a staging directory that becomes iter_<step> only once complete (store.save)."""

    def write(directory: Path) -> None:
        trainer.save(str(directory))
        store.write_driver_state(
            directory,
            {
                "step": step,
                "data": prepared.source.state_dict(),
                "rng": list(rng.getstate()[1]),
                "rng_version": rng.getstate()[0],
                # async mode's rollouts made ahead of the trainer, oldest first
                "rollout_buffers": [
                    {"samples": [s.to_dict() for s in b.samples], "metrics": b.metrics} for b in buffers
                ],
                "partial_groups": prepared.carried.state_dict(),  # partial rollout's carried groups
            },
        )

    return store.save(root, step, write, keep=prepared.spec.checkpoint.max_to_keep)


def save_for_preemption(
    prepared: Prepared,
    trainer: TrainerBackend,
    turns: Turns,
    rng: random.Random,
    source: StepRollouts,
    step: int,
    last_checkpoint: str | None,
) -> str | None:
    """After a SIGTERM: a checkpoint of the last finished step (unless that step saved one,
    ``last_checkpoint``), so the resumed job goes on from the next; the checkpoint written, if any.
    Async mode's generation in flight finishes first: its prompts have left the data source and are
    saved with the checkpoint."""
    state = preemption.current()
    saved = last_checkpoint is not None and (store.read_driver_state(Path(last_checkpoint))["step"] == step)
    written = None
    if step > 0 and not saved:
        t0 = time.perf_counter()
        print(f"preempted: saving a checkpoint of step {step}", flush=True)
        turns.to_trainer()  # colocated: the trainer's state back on its GPU to be saved
        with source.quiet() as buffers:
            path = _save(prepared, trainer, Path(prepared.spec.checkpoint.path), step, rng, buffers)
        written = str(path)
        print(
            f"preempted: checkpoint of step {step} saved in {time.perf_counter() - t0:.1f} s: {path}",
            flush=True,
        )
    state.finished = True
    return written


@dataclass(frozen=True)
class Resumed:
    """The checkpoint a run goes on from: its step and its directory."""

    step: int
    directory: Path


def load_checkpoint(prepared: Prepared, resume: str | None, trainer: TrainerBackend) -> Resumed | None:
    """The latest complete checkpoint into the trainer (before the engines start: they load its HF
    export, and a colocated trainer still holds the GPU), per checkpoint.resume or ``resume``, which
    overrides it."""
    policy = resume or prepared.spec.checkpoint.resume
    root = prepared.spec.checkpoint.path
    for leftover in store.clean(root):  # a save interrupted by a crash: never loaded
        print(f"removed an incomplete checkpoint: {leftover}", flush=True)
    found = store.latest(root) if policy != "never" else None
    if found is None:
        if policy == "required":
            raise RunError(
                f"checkpoint.resume is required but there is no complete checkpoint under {prepared.spec.checkpoint.path}"
            )
        return None
    step, directory = found
    trainer.load(str(directory))
    return Resumed(step, Path(directory))


def restore_driver_state(
    prepared: Prepared, rng: random.Random, resumed: Resumed | None
) -> tuple[int, list[StepRollout]]:
    """The data-source position, the RNG, the rollouts made ahead and the carried groups saved with
    the checkpoint."""
    if resumed is None:
        return 0, []
    state = store.read_driver_state(resumed.directory)
    prepared.source.load_state_dict(state["data"])
    rng.setstate((state["rng_version"], tuple(state["rng"]), None))
    prepared.carried.load_state_dict(state.get("partial_groups", []))
    return resumed.step, _saved_rollouts(state)


def _saved_rollouts(state: dict[str, Any]) -> list[StepRollout]:
    if "rollout_buffers" in state:
        return [
            StepRollout([Sample.from_dict(d) for d in b["samples"]], dict(b.get("metrics", {})))
            for b in state["rollout_buffers"]
        ]
    # Checkpoints before bufferSize > 1: at most one rollout in flight (possibly empty: dynamic
    # sampling that kept no whole global batch).
    samples = [Sample.from_dict(d) for d in state.get("rollout_buffer", [])]
    if not state.get("rollout_buffered", bool(samples)):
        return []
    return [StepRollout(samples, dict(state.get("rollout_buffer_metrics", {})))]
