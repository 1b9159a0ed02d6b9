"""The driver's dynamic-sampling rollout against a fake rollout manager (an 'engine' thread that
finishes groups one by one in submission order) and a rule reward: which groups are kept, the
abort, running out of rounds, the data position."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.data.prompts import Prompt, PromptSource
from rljob_runtime.data.sample import Sample, Status
from rljob_runtime.prepare import Prepared
from rljob_runtime.step_rollout import dynamic_rollout, flatten_groups


class FakeRollout:
    """generate_async queues a group; a thread completes queued groups in order (at most ``limit``,
    then it stalls like a busy engine); abort() finishes every queued group at once, aborted."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.completed = 0
        self.queue: list[tuple[list[Sample], Future[list[Sample]]]] = []
        self.lock = threading.Condition()
        self.aborts = 0
        self.stop = False
        self.thread = threading.Thread(target=self._engine, daemon=True)
        self.thread.start()

    def generate_async(self, samples: list[Sample]) -> Future[list[Sample]]:
        future: Future[list[Sample]] = Future()
        with self.lock:
            self.queue.append((samples, future))
            self.lock.notify()
        return future

    def abort(self) -> None:
        with self.lock:
            self.aborts += 1
            queued, self.queue = self.queue, []
            self.lock.notify()
        for samples, future in queued:
            future.set_result(self._fill(samples, Status.ABORTED))

    def close(self) -> None:
        with self.lock:
            self.stop = True
            self.lock.notify()
        self.thread.join(timeout=5)

    def _engine(self) -> None:
        while True:
            with self.lock:
                while not self.stop and (not self.queue or self.completed == self.limit):
                    self.lock.wait()
                if self.stop:
                    return
                samples, future = self.queue.pop(0)
                self.completed += 1
            future.set_result(self._fill(samples, Status.COMPLETED))

    @staticmethod
    def _fill(samples: list[Sample], status: Status) -> list[Sample]:
        for sample in samples:
            sample.response, sample.response_ids, sample.status = "x", [7], status
        return samples


class RuleReward:
    """1 for the first sample of a group whose prompt row ``signal`` accepts, else 0: the other
    groups have zero reward variance."""

    def __init__(self, signal: Callable[[int], bool]) -> None:
        self.signal = signal
        self.scored: list[int] = []

    async def score(self, samples: list[Sample]) -> list[float]:
        self.scored.append(samples[0].group_index or 0)
        for sample in samples:
            first = sample is samples[0]
            sample.reward = 1.0 if first and self.signal(sample.group_index or 0) else 0.0
        return [float(s.reward or 0.0) for s in samples]  # type: ignore[arg-type]


def make_prepared(reward: Any, *, prompts: int = 64, over: int = 6, rounds: int = 4) -> Prepared:
    spec = RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/unused"},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {
                "dynamicSampling": {"enabled": True, "overSamplingBatchSize": over, "maxRounds": rounds}
            },
            "rollout": {"engine": "hf", "batchSize": 4, "nSamplesPerPrompt": 2},
            "training": {"backend": "torch", "globalBatchSize": 4, "microBatchSize": 1},
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )
    rows = [Prompt(index=i, prompt=f"p{i}", text=f"p{i}", prompt_ids=[1, i + 2]) for i in range(prompts)]
    source = PromptSource(rows, shuffle=False)
    return Prepared(spec, "/unused", source, [], reward, 0)


@pytest.fixture
def rollout() -> Iterator[FakeRollout]:
    fake = FakeRollout()
    yield fake
    fake.close()


def test_keeps_batch_size_groups_with_signal_and_aborts_the_rest(rollout: FakeRollout) -> None:
    prepared = make_prepared(RuleReward(lambda row: row % 2 == 1))
    out = dynamic_rollout(prepared, rollout)
    # round 1: rows 0-5 -> 1, 3, 5 kept; round 2 asks max(1, min(6, ceil(1 / 0.5))) = 2 rows: 6, 7
    groups = [s.group_index for s in out.samples[::2]]
    assert groups == [1, 3, 5, 7]
    assert [s.index for s in out.samples] == list(range(8))
    assert all(s.group_index == g for s, g in zip(out.samples, [1, 1, 3, 3, 5, 5, 7, 7], strict=True))
    m = out.metrics
    assert m["dynamic_sampling/groups_kept"] == 4 and m["dynamic_sampling/groups_trained"] == 4
    assert m["dynamic_sampling/groups_dropped"] == 4  # rows 0, 2, 4, 6
    assert m["dynamic_sampling/rounds"] == 2
    assert prepared.source.offset == 8  # every submitted prompt is consumed, kept or not


def test_surplus_groups_are_aborted_and_dropped() -> None:
    rollout = FakeRollout(limit=6)  # 6 of the 12 groups finish; the rest waits until aborted
    prepared = make_prepared(RuleReward(lambda row: True), over=12)
    try:
        out = dynamic_rollout(prepared, rollout)
    finally:
        rollout.close()
    assert [s.group_index for s in out.samples[::2]] == [0, 1, 2, 3]
    m = out.metrics
    assert m["dynamic_sampling/groups_kept"] == 4 and m["dynamic_sampling/rounds"] == 1
    assert rollout.aborts == 1
    assert m["dynamic_sampling/groups_seen"] + m["dynamic_sampling/groups_abandoned"] == 12
    assert all(s.status == Status.COMPLETED for s in out.samples)
    assert prepared.source.offset == 12


def test_out_of_rounds_trains_on_whole_global_batches(rollout: FakeRollout) -> None:
    # rows 1 and 5 have signal in the one round of 6: 2 groups = 4 samples = one global batch
    prepared = make_prepared(RuleReward(lambda row: row % 4 == 1), rounds=1)
    out = dynamic_rollout(prepared, rollout)
    assert [s.group_index for s in out.samples] == [1, 1, 5, 5]
    assert out.metrics["dynamic_sampling/groups_kept"] == 2
    assert rollout.aborts == 0


def test_out_of_rounds_with_less_than_a_global_batch_trains_nothing(rollout: FakeRollout) -> None:
    prepared = make_prepared(RuleReward(lambda row: row == 2), rounds=2)
    out = dynamic_rollout(prepared, rollout)
    # round 1 kept row 2 only; round 2 asked for 6 more (keep rate 1/6 -> min(6, 18)); none had signal
    assert out.samples == [] and out.metrics["dynamic_sampling/groups_kept"] == 1
    assert out.metrics["dynamic_sampling/groups_trained"] == 0
    assert prepared.source.offset == 12


def test_flatten_groups_renumbers_in_order() -> None:
    groups = [
        [Sample(group_index=9, index=0), Sample(group_index=9, index=1)],
        [Sample(group_index=2, index=0)],
    ]
    flat = flatten_groups(groups)
    assert [(s.group_index, s.index) for s in flat] == [(9, 0), (9, 1), (2, 2)]


def partial_prepared(reward: Any, **kwargs: Any) -> Prepared:
    prepared = make_prepared(reward, **kwargs)
    prepared.spec.rollout.partial_rollout = True
    return prepared


def test_partial_rollout_carries_the_surplus_and_continues_it_first() -> None:
    rollout = FakeRollout(limit=6)  # step 1: rows 0-5 finish, 6-11 wait until aborted
    prepared = partial_prepared(RuleReward(lambda row: True), over=12)
    try:
        first = dynamic_rollout(prepared, rollout)
        assert [s.group_index for s in first.samples[::2]] == [0, 1, 2, 3]
        assert first.metrics["partial/groups_carried"] == 8  # rows 4, 5 (finished) and 6-11 (aborted)
        assert first.metrics["dynamic_sampling/groups_abandoned"] == 0
        assert len(prepared.carried) == 8 and prepared.source.offset == 12
        with rollout.lock:
            rollout.limit = None
            rollout.lock.notify()
        second = dynamic_rollout(prepared, rollout)
    finally:
        rollout.close()
    # the carried groups go first: rows 4 and 5 need no generation, 6 and 7 are the next to finish
    assert [s.group_index for s in second.samples[::2]] == [4, 5, 6, 7]
    assert all(s.status == Status.COMPLETED and s.reward is not None for s in second.samples)
    m = second.metrics
    assert m["partial/groups_continued"] == 8 and m["partial/samples_continued"] == 12
    assert prepared.source.offset == 16  # 12 carried + new rows 12-15 fill the round of 12
    assert m["partial/groups_carried"] == len(prepared.carried)


def test_without_partial_rollout_nothing_is_carried() -> None:
    rollout = FakeRollout(limit=6)
    prepared = make_prepared(RuleReward(lambda row: True), over=12)
    try:
        out = dynamic_rollout(prepared, rollout)
    finally:
        rollout.close()
    assert len(prepared.carried) == 0 and "partial/groups_carried" not in out.metrics


def test_a_custom_filter_replaces_the_zero_variance_default(rollout: FakeRollout) -> None:
    from rljob_runtime.algo.group_filter import GroupFilter

    prepared = make_prepared(RuleReward(lambda row: False))  # no group has reward variance
    prepared.group_filter = GroupFilter(lambda group: (group[0].group_index % 3 != 0, "every third row"))
    out = dynamic_rollout(prepared, rollout)
    assert [s.group_index for s in out.samples[::2]] == [1, 2, 4, 5]
    assert out.metrics["dynamic_sampling/dropped/every_third_row"] == 2  # rows 0 and 3
    assert "dynamic_sampling/dropped/zero_variance" not in out.metrics
