"""The token-budget micro-batch planner (training.dynamicBatch): every row once, within the budget,
as few micro-batches as LPT can fit, balanced, deterministic, a row over the budget alone; and the
rank's plan built from it per optimizer step."""

from __future__ import annotations

import random

import pytest
import torch

from rljob_runtime.algo.packing import plan_micro_batches
from rljob_runtime.data.sample import Sample
from rljob_runtime.trainer.base import build_batch, place_rows, step_counts, step_rows


def check(plan: list[list[int]], lengths: list[int], budget: int) -> None:
    assert sorted(r for mb in plan for r in mb) == list(range(len(lengths)))
    for mb in plan:
        assert mb == sorted(mb) and mb
        assert sum(lengths[r] for r in mb) <= budget or len(mb) == 1
    assert [mb[0] for mb in plan] == sorted(mb[0] for mb in plan)


def test_rows_fill_the_fewest_micro_batches_evenly() -> None:
    lengths = [10, 10, 10, 10, 20, 20]  # 80 tokens, budget 40: two micro-batches of 40
    plan = plan_micro_batches(lengths, 40)
    check(plan, lengths, 40)
    assert sorted(sum(lengths[r] for r in mb) for mb in plan) == [40, 40]


def test_micro_batches_are_balanced_not_filled_in_order() -> None:
    lengths = [40, 30, 30, 20, 10, 10]  # 140 tokens, budget 100: first fit in order gives 100 | 40
    plan = plan_micro_batches(lengths, 100)
    check(plan, lengths, 100)
    assert sorted(sum(lengths[r] for r in mb) for mb in plan) == [70, 70]


def test_a_long_tail_takes_the_fewest_micro_batches() -> None:
    lengths = [4000, 3900, 300, 200, 200, 150, 100, 100, 50, 50]
    plan = plan_micro_batches(lengths, 4096)
    check(plan, lengths, 4096)
    assert len(plan) == 3  # 9050 tokens: ceil(9050 / 4096) = 3, the two long rows apart


def test_a_row_longer_than_the_budget_is_alone_and_whole() -> None:
    lengths = [5, 50, 5, 5]
    plan = plan_micro_batches(lengths, 16)
    check(plan, lengths, 16)
    assert [1] in plan and len(plan) == 2


def test_the_plan_is_deterministic_and_covers_random_mixes() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        budget = rng.choice([8, 64, 500, 4096])
        lengths = [rng.choice([1, 2, rng.randint(1, budget), rng.randint(1, 2 * budget)]) for _ in range(n)]
        plan = plan_micro_batches(lengths, budget)
        check(plan, lengths, budget)
        assert plan == plan_micro_batches(list(lengths), budget)
        fitting = sum(n for n in lengths if n <= budget)
        assert len(plan) >= -(-fitting // budget) + sum(n > budget for n in lengths)


@pytest.mark.parametrize("bad", [0, -1])
def test_a_budget_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        plan_micro_batches([1, 2], bad)


def test_packed_layout_positions_restart_and_logit_index_follows_the_rows() -> None:
    batch = build_batch(
        [
            Sample(prompt_ids=[1, 2, 3], response_ids=[10, 11]),
            Sample(prompt_ids=[4], response_ids=[12, 13, 14]),
            Sample(prompt_ids=[5, 6], response_ids=[]),
        ]
    )
    packed = batch.packed()
    assert packed.input_ids.tolist() == [[1, 2, 3, 10, 11, 4, 12, 13, 14, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 5, 9, 11] and packed.max_seqlen == 5
    # response token j of row i is predicted at offset_i + P_i + j - 1 (padding repeats the last)
    assert packed.logit_index.tolist() == [[2, 3, 3], [5, 6, 7], [10, 10, 10]]
    flat = packed.input_ids[0]
    for i in range(batch.size):
        n = int(batch.response_lengths[i])
        assert flat[packed.logit_index[i, :n] + 1].tolist() == batch.response_ids[i, :n].tolist()


def test_results_of_unordered_micro_batches_land_on_their_rows() -> None:
    parts = [([2, 0], torch.tensor([[3.0, 3.0], [1.0, 0.0]])), ([1], torch.tensor([[2.0]]))]
    assert place_rows(parts, 3, 2).tolist() == [[1.0, 0.0], [2.0, 0.0], [3.0, 3.0]]


def test_step_counts_read_every_row_of_a_step_whatever_its_micro_batches() -> None:
    batch = build_batch([Sample(prompt_ids=[1], response_ids=[2] * n) for n in (1, 2, 3, 4)])
    plan = [[[3, 0], [1]], [[2]]]
    assert step_rows(plan[0], 4) == [0, 1, 3]
    assert step_counts(batch, plan, "token").tolist() == [7.0, 3.0]
