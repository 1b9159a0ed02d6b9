"""What the loop reports of the policy's samples: each step's rollout metrics (reward, response
length, truncation, generation throughput) and, on data.eval's interval, the mean reward on each
evaluation dataset, sampled with data.eval's settings."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .data.rewards.base import scalar_reward
from .data.sample import Sample, Status

if TYPE_CHECKING:
    from .prepare import Prepared
    from .rollout.base import Rollout


def rollout_metrics(
    samples: Sequence[Sample], generate_seconds: float, reward_key: str | None = None
) -> dict[str, float]:
    rewards = [scalar_reward(s, reward_key) for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    n = max(len(samples), 1)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / n
    return {
        "reward/mean": mean,
        "reward/std": var**0.5,
        "response_length/mean": sum(lengths) / n,
        "response/truncated_frac": sum(s.status == Status.TRUNCATED for s in samples) / n,
        "rollout/tokens_per_s": sum(lengths) / max(generate_seconds, 1e-9),
    }


def evaluate(prepared: Prepared, rollout: Rollout) -> dict[str, float]:
    """Mean reward per evaluation dataset, sampled with data.eval's settings."""
    spec = prepared.spec
    out = {}
    for dataset in prepared.eval_sets:
        samples = dataset.samples()
        rollout.generate(
            samples,
            temperature=spec.data.eval.temperature,
            top_p=spec.data.eval.top_p,
            max_new_tokens=dataset.max_response_len or spec.rollout.max_response_len,
        )
        asyncio.run(prepared.reward.score(samples))
        out[dataset.name] = sum(scalar_reward(s, spec.reward.reward_key) for s in samples) / max(
            len(samples), 1
        )
    return out
