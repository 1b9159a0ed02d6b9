"""Dynamic sampling's group filter: the zero-variance default, rollout.customFilter (sync or async,
bool or (bool, reason)), its import errors before anything starts, and the carried groups' state."""

from __future__ import annotations

import asyncio

import pytest

from rljob_runtime.algo.group_filter import CustomFilterError, GroupFilter, Verdict, load_group_filter
from rljob_runtime.carried import CarriedGroups, unfinished
from rljob_runtime.data.sample import Sample, Status


def group(*rewards: float) -> list[Sample]:
    return [Sample(group_index=3, index=i, reward=r, status=Status.COMPLETED) for i, r in enumerate(rewards)]


def keep_long(samples: list[Sample]) -> tuple[bool, str]:
    return len(samples) > 2, "too few samples!"


async def keep_async(samples: list[Sample]) -> bool:
    await asyncio.sleep(0)
    return samples[0].reward == 1.0


def answers_nonsense(samples: list[Sample]) -> str:
    return "yes"


def takes_two(samples: list[Sample], other: int) -> bool:
    return True


def verdict(f: GroupFilter, samples: list[Sample]) -> Verdict:
    return asyncio.run(f(samples))


def test_the_default_keeps_groups_whose_rewards_differ() -> None:
    f = load_group_filter(None)
    assert verdict(f, group(1.0, 0.0)) == Verdict(True)
    assert verdict(f, group(1.0, 1.0)) == Verdict(False, "zero_variance")


def test_the_default_reads_the_reward_key_of_dict_rewards() -> None:
    f = load_group_filter(None, reward_key="acc")
    samples = [Sample(reward={"acc": 1.0, "len": 3}), Sample(reward={"acc": 1.0, "len": 4})]
    assert verdict(f, samples) == Verdict(False, "zero_variance")


def test_a_custom_filter_answers_with_a_reason_sync_or_async() -> None:
    f = load_group_filter(f"{__name__}:keep_long")
    assert verdict(f, group(0.0, 0.0, 0.0)) == Verdict(True)
    assert verdict(f, group(1.0, 0.0)) == Verdict(False, "too_few_samples")  # a metric-safe name
    g = load_group_filter(f"{__name__}:keep_async")
    assert verdict(g, group(1.0, 1.0)) == Verdict(True)
    assert verdict(g, group(0.0, 1.0)) == Verdict(False, "custom")


def test_a_custom_filter_that_answers_nonsense_fails_naming_the_field() -> None:
    f = load_group_filter(f"{__name__}:answers_nonsense")
    with pytest.raises(CustomFilterError, match=r"rollout.customFilter .*answered 'yes'"):
        verdict(f, group(1.0))


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("no_such_module_here:keep", "cannot import module"),
        (f"{__name__}:missing", "has no attribute"),
        (f"{__name__}:takes_two", "cannot be called with one group"),
        ("nocolon", "expected 'package.module:function'"),
    ],
)
def test_import_errors_name_the_field_and_path(path: str, why: str) -> None:
    with pytest.raises(CustomFilterError, match=r"rollout\.customFilter") as err:
        load_group_filter(path)
    assert why in str(err.value)


def test_carried_groups_round_trip_and_are_scored_again() -> None:
    carried = CarriedGroups()
    done = Sample(group_index=1, prompt_ids=[1], response_ids=[5, 6], status=Status.COMPLETED, reward=1.0)
    cut = Sample(group_index=1, prompt_ids=[1], response_ids=[5], status=Status.ABORTED)
    fresh = Sample(group_index=2, prompt_ids=[2], status=Status.ABORTED)  # aborted while queued
    carried.put([[done, cut], [fresh]])
    assert done.reward is None  # the group is scored again once whole
    assert len(carried) == 2 and carried.tokens() == 3
    again = CarriedGroups()
    again.load_state_dict(carried.state_dict())
    first = again.take(1)
    assert [[s.response_ids for s in g] for g in first] == [[[5, 6], [5]]]
    assert unfinished(first[0]) == [first[0][1]]
    assert len(again) == 1 and again.take(5)[0][0].group_index == 2 and len(again) == 0


def _group(*lengths: int | None) -> list[Sample]:
    """A carried group: an int is an aborted sample with that many tokens, None a finished one."""
    return [
        Sample(prompt_ids=[1], response_ids=[7] * (n or 4), status=Status.COMPLETED)
        if n is None
        else Sample(prompt_ids=[1], response_ids=[7] * n, status=Status.ABORTED)
        for n in lengths
    ]


def test_carried_groups_nearest_completion_go_first() -> None:
    """Groups aborted while queued come back first; they must not go ahead of half-generated ones."""
    queued, one_behind, far, near, done = (
        _group(0, 0),
        _group(None, 0),
        _group(3, 12),
        _group(9, 10),
        _group(None),
    )
    carried = CarriedGroups()
    carried.put([queued, one_behind, far, near, done])
    assert carried.take(3) == [done, near, far]
    assert carried.take(5) == [queued, one_behind]  # equally far: oldest first
