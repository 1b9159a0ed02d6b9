"""How far behind the trainer the samples of a step were generated (async mode, partial rollout).

A token made by weight version v (``Sample.token_versions``; version k = the weights after k training
steps) and trained at step k (the trainer's weights have taken k updates) is k - v steps stale: 0 in
synchronous training, 1 one step off-policy, more with a deeper buffer or a continued response."""

from __future__ import annotations

from collections.abc import Sequence

from ..data.sample import Sample, stale_token_mask


def staleness_metrics(samples: Sequence[Sample], step: int) -> dict[str, float]:
    """Per-sample staleness (of its oldest token) mean / max, tokens' mean, and how many samples mix
    weight versions; empty when no sample knows its tokens' versions."""
    per_sample: list[int] = []
    token_total = token_count = mixed = 0
    for sample in samples:
        versions = sample.token_versions
        if not versions:
            continue
        per_sample.append(step - min(versions))
        token_total += sum(step - v for v in versions)
        token_count += len(versions)
        mixed += int(min(versions) != max(versions))
    if not per_sample:
        return {}
    return {
        "rollout/staleness_mean": sum(per_sample) / len(per_sample),
        "rollout/staleness_max": float(max(per_sample)),
        "rollout/token_staleness_mean": token_total / token_count,
        "rollout/mixed_version_samples": float(mixed),
    }


def mask_off_policy_tokens(samples: Sequence[Sample]) -> int:
    """rollout.maskOffPolicyPartialTokens: leave out of the loss the tokens of each sample made by an
    older weight version than its newest (in place); returns how many were masked."""
    masked = 0
    for sample in samples:
        before = sample.effective_loss_mask()
        after = stale_token_mask(sample)
        masked += sum(before) - sum(after)
        sample.loss_mask = after
    return masked
