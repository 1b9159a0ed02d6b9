"""Async mode's producer (``rollouts_ahead``): at most ``depth`` rollouts ahead of the trainer, none
made while the driver holds it quiet, restored rollouts first, errors raised where the driver waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from rljob_runtime.rollouts_ahead import RolloutsAhead
from rljob_runtime.step_rollout import StepRollout


class Producer:
    """Makes numbered rollouts; each waits for ``release`` when gated (a generation in progress)."""

    def __init__(self, gated: bool = False) -> None:
        self.made = 0
        self.started = 0
        self.gated = gated
        self.release = threading.Semaphore(0)
        self.lock = threading.Lock()

    def __call__(self) -> StepRollout:
        with self.lock:
            self.started += 1
            number = self.started
        if self.gated:
            self.release.acquire()
        with self.lock:
            self.made += 1
        return StepRollout([], {"number": float(number)})


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def settle() -> None:
    time.sleep(0.05)  # room for a wrongly started production to show


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_makes_at_most_depth_rollouts_ahead(depth: int) -> None:
    produce = Producer()
    ahead = RolloutsAhead(produce, depth=depth, count=10)
    eventually(lambda: produce.made == depth)
    settle()
    assert produce.started == depth
    assert ahead.take().metrics["number"] == 1.0
    eventually(lambda: produce.made == depth + 1)  # taking one makes room for one more
    settle()
    assert produce.started == depth + 1
    ahead.close()


def test_stops_after_count_and_then_says_so() -> None:
    produce = Producer()
    ahead = RolloutsAhead(produce, depth=4, count=2)
    assert [ahead.take().metrics["number"] for _ in range(2)] == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="no rollout left"):
        ahead.take()
    assert produce.started == 2


def test_restored_rollouts_come_first_and_count_against_the_depth() -> None:
    produce = Producer()
    saved = [StepRollout([], {"number": -2.0}), StepRollout([], {"number": -1.0})]
    ahead = RolloutsAhead(produce, depth=2, count=3, ready=saved)
    settle()
    assert produce.started == 0  # two restored rollouts fill the buffer
    assert [ahead.take().metrics["number"] for _ in range(5)] == [-2.0, -1.0, 1.0, 2.0, 3.0]
    ahead.close()


def test_quiet_finishes_the_rollout_in_progress_and_starts_none() -> None:
    produce = Producer(gated=True)
    ahead = RolloutsAhead(produce, depth=2, count=10)
    eventually(lambda: produce.started == 1)
    entered = threading.Event()

    def hold() -> None:
        with ahead.quiet():
            entered.set()
            assert not ahead.making
            assert [b.metrics["number"] for b in ahead.buffered()] == [1.0]
            settle()
            assert produce.started == 1  # the room left in the buffer is not used while quiet

    holder = threading.Thread(target=hold)
    holder.start()
    settle()
    assert not entered.is_set()  # waits for the generation in progress
    produce.release.release()
    holder.join(5)
    assert entered.is_set() and not holder.is_alive()
    eventually(lambda: produce.started == 2)  # production goes on once released
    produce.release.release()
    produce.release.release()
    ahead.close()


def test_a_failed_rollout_is_raised_by_take_and_by_quiet() -> None:
    def produce() -> StepRollout:
        raise ValueError("engine gone")

    ahead = RolloutsAhead(produce, depth=1, count=3)
    with pytest.raises(ValueError, match="engine gone"):
        ahead.take()
    with pytest.raises(ValueError, match="engine gone"), ahead.quiet():
        pass


def test_close_without_waiting_leaves_a_stuck_generation_behind() -> None:
    produce = Producer(gated=True)
    ahead = RolloutsAhead(produce, depth=1, count=3)
    eventually(lambda: produce.started == 1)
    started = time.monotonic()
    ahead.close(wait=False)
    assert time.monotonic() - started < 1
    produce.release.release()  # the daemon thread ends; nothing more is made
    settle()
    assert produce.started == 1


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RolloutsAhead(Producer(), depth=0, count=1)
