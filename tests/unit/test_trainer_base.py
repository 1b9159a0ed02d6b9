"""Trainer batches (padding, token alignment), the learning-rate schedule and data-parallel sharding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rljob_api.spec_training import OptimizerSpec
from rljob_runtime.algo.batching import micro_batch_slices, optimizer_step_slices
from rljob_runtime.data.sample import Sample
from rljob_runtime.trainer.base import (
    TrainBatch,
    build_batch,
    check_per_token,
    check_policy_inputs,
    local_plan,
    loss_denominator,
    lr_at,
    mean_metrics,
    pad_columns,
    pad_per_token,
    rank_rows,
    step_counts,
    unpad_per_token,
)


def samples() -> list[Sample]:
    return [
        Sample(prompt_ids=[1, 2, 3], response_ids=[10, 11], rollout_logprobs=[-0.5, -0.25]),
        Sample(
            prompt_ids=[4], response_ids=[12, 13, 14, 15], loss_mask=[1, 0, 0, 1], rollout_logprobs=[-1.0] * 4
        ),
        Sample(prompt_ids=[5, 6], response_ids=[], rollout_logprobs=[]),
    ]


def test_build_batch_pads_right() -> None:
    batch = build_batch(samples(), pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11], [4, 12, 13, 14, 15], [5, 6, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.prompt_lengths.tolist() == [3, 1, 2]
    assert batch.response_lengths.tolist() == [2, 4, 0]
    assert batch.response_ids.tolist() == [[10, 11, 0, 0], [12, 13, 14, 15], [0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 1], [0, 0, 0, 0]]
    assert batch.response_mask().tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert batch.rollout_logp is not None
    assert batch.rollout_logp.tolist() == [[-0.5, -0.25, 0, 0], [-1.0] * 4, [0.0] * 4]


def test_logit_positions_predict_the_response_tokens() -> None:
    """The log-prob of response token j comes from the logits at position P + j - 1."""
    batch = build_batch(samples())
    positions = batch.logit_positions()
    assert positions.tolist() == [[2, 3, 3, 3], [0, 1, 2, 3], [1, 1, 1, 1]]
    for i in range(batch.size):
        for j in range(int(batch.response_lengths[i])):
            assert batch.input_ids[i, positions[i, j] + 1] == batch.response_ids[i, j]


def test_rollout_logp_only_when_every_sample_has_them() -> None:
    items = samples()
    items[1].rollout_logprobs = None
    assert build_batch(items).rollout_logp is None


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        (Sample(prompt_ids=[], response_ids=[1]), "no prompt tokens"),
        (Sample(prompt_ids=[1], response_ids=[1, 2], loss_mask=[1]), "loss mask of 1"),
        (Sample(prompt_ids=[1], response_ids=[1, 2], rollout_logprobs=[0.0]), "1 rollout log-probs"),
    ],
)
def test_build_batch_refuses_inconsistent_samples(sample: Sample, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_batch([sample])


def test_select_trims_to_the_rows() -> None:
    batch = build_batch(samples())
    sub = batch.select(slice(0, 1))
    assert sub.input_ids.tolist() == [[1, 2, 3, 10, 11]]
    assert sub.response_ids.tolist() == [[10, 11]]
    assert sub.width == 2
    picked = batch.select([2, 0])
    assert picked.prompt_lengths.tolist() == [2, 3]
    assert picked.input_ids.shape == (2, 5)
    assert picked.loss_mask.tolist() == [[0, 0], [1, 1]]
    empty_only = batch.select([2])
    assert empty_only.width == 1 and empty_only.loss_mask.sum() == 0


def test_pad_helpers_round_trip() -> None:
    ragged = [[1.0, 2.0], [], [3.0]]
    padded = pad_per_token(ragged)
    assert padded.tolist() == [[1, 2], [0, 0], [3, 0]]
    assert unpad_per_token(padded, [2, 0, 1]) == ragged
    assert pad_columns(padded, 3).tolist() == [[1, 2, 0], [0, 0, 0], [3, 0, 0]]
    assert pad_columns(padded, 1).tolist() == [[1], [0], [3]]
    with pytest.raises(ValueError, match="shorter"):
        pad_per_token(ragged, width=1)


def test_check_per_token() -> None:
    batch = build_batch(samples())
    assert check_per_token("a", torch.ones(3, 6), batch).shape == (3, 4)
    with pytest.raises(ValueError, match=r"expected a \[3, T\] tensor"):
        check_per_token("a", torch.ones(2, 4), batch)
    with pytest.raises(ValueError, match="longest response has 4"):
        check_per_token("a", torch.ones(3, 3), batch)


def test_loss_denominator() -> None:
    mask = build_batch(samples()).loss_mask
    assert loss_denominator(mask, "token") == 4.0
    assert loss_denominator(mask, "sample") == 2.0  # the empty response does not count
    assert loss_denominator(torch.zeros(2, 3), "token") == 1.0


def test_step_counts_are_this_ranks_unclamped_counts_per_step() -> None:
    batch = build_batch(samples())
    one_step_per_row = [[slice(0, 1)], [slice(1, 2)], [slice(2, 3)]]
    counts = step_counts(batch, one_step_per_row, "token")
    assert counts.dtype == torch.float64
    assert counts.tolist() == [float(batch.loss_mask[i].sum()) for i in range(3)]
    assert 0.0 in step_counts(batch, one_step_per_row, "sample").tolist()  # summed over ranks, then clamped


def test_mean_metrics_average_over_steps() -> None:
    assert mean_metrics([{"loss": 1.0, "kl": 0.0}, {"loss": 3.0, "kl": 1.0}]) == {"loss": 2.0, "kl": 0.5}


def test_policy_inputs_need_ref_logp_only_with_kl_loss() -> None:
    batch = build_batch(samples())
    lp = torch.zeros(batch.size, batch.width)
    adv, old, ref = check_policy_inputs(batch, lp, lp, None, use_kl_loss=False)
    assert ref is None and adv.shape == old.shape == (batch.size, batch.width)
    with pytest.raises(ValueError, match="useKLLoss needs ref_logp"):
        check_policy_inputs(batch, lp, lp, None, use_kl_loss=True)


# ------------------------------------------------------------------------------------ sharding


def test_rank_rows_take_a_contiguous_share_of_every_global_batch() -> None:
    assert rank_rows(8, 4, 2, 0) == [0, 1, 4, 5]
    assert rank_rows(8, 4, 2, 1) == [2, 3, 6, 7]
    assert rank_rows(4, 4, 1, 0) == [0, 1, 2, 3]
    every = sorted(r for rank in range(4) for r in rank_rows(16, 8, 4, rank))
    assert every == list(range(16))
    with pytest.raises(ValueError):
        rank_rows(6, 4, 2, 0)


@pytest.mark.parametrize(
    ("n", "gbs", "mbs", "dp"), [(8, 4, 1, 2), (16, 8, 2, 2), (12, 12, 3, 4), (8, 8, 2, 1)]
)
def test_sharding_agrees_with_algo_batching(n: int, gbs: int, mbs: int, dp: int) -> None:
    """rank_rows + local_plan give each rank the micro-batches algo.batching assigns it."""
    for rank in range(dp):
        rows = rank_rows(n, gbs, dp, rank)
        plan = local_plan(len(rows), gbs // dp, mbs)
        expected = [
            [
                list(range(step.start + mb.start, step.start + mb.stop))
                for mb in micro_batch_slices(gbs, mbs, rank, dp)
            ]
            for step in optimizer_step_slices(n, gbs)
        ]
        assert [[rows[s] for s in step] for step in plan] == expected


def test_local_plan_refuses_ragged_splits() -> None:
    with pytest.raises(ValueError):
        local_plan(6, 4, 2)
    with pytest.raises(ValueError):
        local_plan(8, 4, 3)


# ------------------------------------------------------------------------------- learning rate


def opt(**kw: object) -> OptimizerSpec:
    return OptimizerSpec.model_validate({"lr": 1e-3, "minLr": 1e-4, **kw})


def test_constant_lr_with_warmup() -> None:
    spec = opt(lrWarmupSteps=4)
    assert [lr_at(s, spec, 10) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert lr_at(0, opt(), 10) == 1e-3


def test_linear_decay_reaches_min_lr() -> None:
    spec = opt(lrDecayStyle="linear", lrWarmupSteps=2)
    assert lr_at(1, spec, 12) == pytest.approx(1e-3)
    assert lr_at(2, spec, 12) == pytest.approx(1e-3)
    assert lr_at(7, spec, 12) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert lr_at(12, spec, 12) == pytest.approx(1e-4)
    assert lr_at(100, spec, 12) == pytest.approx(1e-4)
    lrs = [lr_at(s, spec, 12) for s in range(2, 13)]
    assert all(a > b for a, b in itertools.pairwise(lrs))


def test_cosine_decay() -> None:
    spec = opt(lrDecayStyle="cosine")
    assert lr_at(0, spec, 10) == pytest.approx(1e-3)
    assert lr_at(5, spec, 10) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(10, spec, 10) == pytest.approx(1e-4)


def test_train_batch_is_a_dataclass_of_tensors() -> None:
    moved = build_batch(samples()).to("cpu")
    assert isinstance(moved, TrainBatch)
    assert moved.input_ids.device.type == "cpu"


def test_group_takes_a_full_rollout_or_fewer_whole_global_batches() -> None:
    from rljob_api.spec import RLTrainingJobSpec
    from rljob_runtime.trainer.group import TrainerGroup

    spec = RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/unused"},
            "data": {"path": "/unused.jsonl"},
            "rollout": {"engine": "hf", "batchSize": 4, "nSamplesPerPrompt": 2},
            "training": {"backend": "torch", "globalBatchSize": 4, "microBatchSize": 1},
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )
    group = TrainerGroup(spec, actors=[])
    for n in (8, 4):  # the rollout; dynamic sampling out of rounds with one global batch
        group._check_identity([Sample()] * n)
    for n in (0, 6, 12):
        with pytest.raises(ValueError, match="fewer whole global batches of 4"):
            group._check_identity([Sample()] * n)
