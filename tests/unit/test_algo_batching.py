"""Batch identity and dynamic sampling bookkeeping."""

from __future__ import annotations

import pytest
import torch

from rljob_api.spec_algorithm import AlgorithmSpec, DynamicSamplingSpec
from rljob_runtime.algo.batching import (
    micro_batch_slices,
    optimizer_step_slices,
    steps_per_rollout,
    trainable_groups,
)
from rljob_runtime.algo.dynamic_sampling import DynamicSampler, filter_groups, has_signal
from rljob_runtime.algo.losses import policy_loss


@pytest.mark.parametrize(
    ("rollout_batch", "n", "gbs", "steps"), [(32, 8, 256, 1), (4, 8, 16, 2), (3, 4, 2, 6), (1, 1, 1, 1)]
)
def test_steps_per_rollout(rollout_batch: int, n: int, gbs: int, steps: int) -> None:
    assert steps_per_rollout(rollout_batch, n, gbs) == steps
    slices = optimizer_step_slices(rollout_batch * n, gbs)
    assert len(slices) == steps
    covered = [i for s in slices for i in range(rollout_batch * n)[s]]
    assert covered == list(range(rollout_batch * n))  # every sample in exactly one optimizer step


def test_batch_identity_errors() -> None:
    with pytest.raises(ValueError, match=r"= 24 is not a multiple of training\.globalBatchSize 16"):
        steps_per_rollout(3, 8, 16)
    with pytest.raises(ValueError, match="microBatchSize 3"):
        micro_batch_slices(16, 3)


def test_micro_batches_per_rank() -> None:
    assert micro_batch_slices(8, 2, dp_rank=1, dp_size=2) == [slice(4, 6), slice(6, 8)]
    ranks = [micro_batch_slices(8, 2, r, 2) for r in range(2)]
    assert sorted(i for rank in ranks for s in rank for i in range(8)[s]) == list(range(8))


@pytest.mark.parametrize("reduction", ["token", "sample"])
def test_micro_batch_losses_sum_to_global_loss(reduction: str) -> None:
    torch.manual_seed(0)
    logp, old, adv = torch.randn(8, 6), torch.randn(8, 6), torch.randn(8, 6)
    mask = (torch.rand(8, 6) > 0.3).long()
    mask[:, 0] = 1
    spec = AlgorithmSpec(lossReduction=reduction)
    full, _ = policy_loss(spec, logp, old, adv, mask)
    denom = float(mask.sum()) if reduction == "token" else 8.0
    parts = [
        policy_loss(spec, logp[s], old[s], adv[s], mask[s], denominator=denom)[0]
        for s in micro_batch_slices(8, 2)
    ]
    assert torch.stack(parts).sum().item() == pytest.approx(full.item(), rel=1e-5)


def test_has_signal_and_filter() -> None:
    assert not has_signal([1.0, 1.0, 1.0]) and has_signal([1.0, 0.0, 1.0]) and not has_signal([0.5])
    kept, dropped = filter_groups(["a", "b", "c"], [[0, 0], [0, 1], [1, 1]])
    assert (kept, dropped) == (["b"], 2)


def test_dynamic_sampler_over_samples_until_enough() -> None:
    ds = DynamicSampler[str](target_groups=8, over_sampling_batch_size=10, max_rounds=5)
    assert ds.start_round() == 10
    for i in range(10):
        ds.add_group(f"g{i}", [0.0, float(i % 2)])  # every other group has signal
    assert len(ds.kept_groups) == 5 and ds.dropped == 5 and not ds.done
    # shortfall 3 at keep rate 1/2 -> 6 prompts (between the shortfall and the over-sampling batch)
    assert ds.start_round() == 6
    for i in range(6):
        ds.add_group(f"h{i}", [0.0, 1.0])
    assert ds.done and len(ds.kept_groups) == 8  # surplus groups are not kept
    assert ds.prompts_to_request() == 0
    assert ds.metrics()["dynamic_sampling/groups_seen"] == 16.0


def test_dynamic_sampler_stops_after_max_rounds() -> None:
    ds = DynamicSampler[str](target_groups=4, over_sampling_batch_size=4, max_rounds=2)
    for _ in range(2):
        assert ds.start_round() == 4
        for i in range(4):
            ds.add_group(str(i), [1.0, 1.0])
    assert ds.done and ds.kept_groups == [] and ds.start_round() == 0


def test_dynamic_sampler_from_spec_and_disabled() -> None:
    on = DynamicSampler.from_spec(
        DynamicSamplingSpec(enabled=True, overSamplingBatchSize=48, maxRounds=3), 32
    )
    assert (on.over_sampling_batch_size, on.max_rounds, on.start_round()) == (48, 3, 48)
    off = DynamicSampler.from_spec(DynamicSamplingSpec(), 32)
    assert off.start_round() == 32
    for i in range(32):
        assert off.add_group(i, [1.0, 1.0])  # zero-variance groups are kept when disabled
    assert off.done


@pytest.mark.parametrize(
    ("groups", "n", "gbs", "trained"),
    [
        (4, 2, 8, 4),  # a full rollout: 8 samples, one global batch
        (3, 2, 8, 0),  # 6 samples fill no global batch of 8
        (5, 2, 4, 4),  # 10 samples -> 2 global batches of 4 = 4 groups
        (7, 3, 4, 4),  # groups of 3 fill global batches of 4 only 4 groups (12 samples) at a time
        (2, 8, 4, 2),  # a group spans 2 global batches
        (0, 4, 4, 0),
    ],
)
def test_trainable_groups_fill_whole_global_batches(groups: int, n: int, gbs: int, trained: int) -> None:
    assert trainable_groups(groups, n, gbs) == trained
    assert trained * n % gbs == 0


def test_trainable_groups_refuses_bad_sizes() -> None:
    with pytest.raises(ValueError, match="bad sizes"):
        trainable_groups(1, 0, 4)
