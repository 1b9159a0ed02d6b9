"""The ``rollout.customFilter`` of the rollout-modes benchmark's partial modes (``rollout_modes.py``):
keep every group. With it, ``algorithm.dynamicSampling`` is pure over-sampling: a step submits
``overSamplingBatchSize`` prompts, trains on the first ``rollout.batchSize`` groups that complete
(whatever their rewards) and, with ``rollout.partialRollout``, carries the aborted rest to the next
step. Named in the spec as ``keep_all_filter:keep`` (``benchmarks/gpu`` is on ``sys.path`` there)."""

from __future__ import annotations

from typing import Any


def keep(samples: list[Any]) -> bool:
    """Every group is kept (no filtering)."""
    return True
