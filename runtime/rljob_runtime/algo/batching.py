"""Batch identity: rollout.batchSize * nSamplesPerPrompt = globalBatchSize * optimizer steps per rollout,
and the split of a rollout into optimizer steps and micro-batches."""

from __future__ import annotations

import math


def steps_per_rollout(rollout_batch_size: int, n_samples_per_prompt: int, global_batch_size: int) -> int:
    """Optimizer steps one rollout feeds; the spec rules guarantee it divides evenly."""
    samples = rollout_batch_size * n_samples_per_prompt
    if samples % global_batch_size:
        raise ValueError(
            f"rollout.batchSize * nSamplesPerPrompt = {samples} is not a multiple of "
            f"training.globalBatchSize {global_batch_size}"
        )
    return samples // global_batch_size


def optimizer_step_slices(num_samples: int, global_batch_size: int) -> list[slice]:
    """Consecutive slices of the rollout batch, one per optimizer step (every sample exactly once)."""
    if num_samples % global_batch_size:
        raise ValueError(f"{num_samples} samples do not fill whole global batches of {global_batch_size}")
    return [slice(i, i + global_batch_size) for i in range(0, num_samples, global_batch_size)]


def micro_batch_slices(
    global_batch_size: int, micro_batch_size: int, dp_rank: int = 0, dp_size: int = 1
) -> list[slice]:
    """Micro-batches (offsets within one global batch) of one data-parallel rank: rank r takes
    a contiguous 1/dp_size of the global batch, then splits it into micro_batch_size pieces."""
    if global_batch_size % (micro_batch_size * dp_size):
        raise ValueError(
            f"globalBatchSize {global_batch_size} is not a multiple of microBatchSize {micro_batch_size} "
            f"* data-parallel size {dp_size}"
        )
    per_rank = global_batch_size // dp_size
    start = dp_rank * per_rank
    return [slice(i, i + micro_batch_size) for i in range(start, start + per_rank, micro_batch_size)]


def trainable_groups(num_groups: int, group_size: int, global_batch_size: int) -> int:
    """The most of ``num_groups`` whole groups that fill whole global batches (dynamic sampling out of
    rounds trains on fewer groups than rollout.batchSize: whole groups keep GRPO's statistics, whole
    global batches keep every optimizer step the size the learning rate was tuned for)."""
    if num_groups < 0 or group_size < 1 or global_batch_size < 1:
        raise ValueError(f"bad sizes: {num_groups} groups of {group_size}, global batch {global_batch_size}")
    unit = global_batch_size // math.gcd(global_batch_size, group_size)  # groups per whole global batch
    return num_groups // unit * unit
