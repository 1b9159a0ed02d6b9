"""leader.py: the lease decisions of client-go's leader election, on this replica's own clock (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rljob_operator.leader import (
    Record,
    Seen,
    Timing,
    lease_body,
    next_step,
    observe,
    record_of,
    released,
    renewed,
)

WALL = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
STAMP = "2026-01-02T03:04:05.678901Z"
TIMING = Timing(lease_duration=10, renew_deadline=7, retry_period=1)


def held(holder: str, transitions: int = 3) -> Record:
    return Record(holder, 10, "2026-01-02T00:00:00.000000Z", "2026-01-02T03:00:00.000000Z", transitions)


def test_no_lease_is_created_with_this_replica_as_holder() -> None:
    step = next_step(observe(None, None, 100.0), "me", 100.0, WALL, TIMING)
    assert step.action == "create"
    assert step.record == Record("me", 10, STAMP, STAMP, 0)


def test_a_lease_held_by_another_is_waited_for_until_unchanged_for_its_duration() -> None:
    seen = observe(None, held("other"), 100.0)
    assert next_step(seen, "me", 109.9, WALL, TIMING).action == "wait"
    assert "held by other" in next_step(seen, "me", 105.0, WALL, TIMING).why
    step = next_step(seen, "me", 110.0, WALL, TIMING)
    assert step.action == "update" and step.record == Record("me", 10, STAMP, STAMP, 4)
    assert "did not renew it for 10 s" in step.why


def test_the_clock_restarts_at_each_renewal_seen_and_never_reads_the_lease_times() -> None:
    first = observe(None, held("other"), 100.0)
    assert observe(first, held("other"), 105.0) is first  # unchanged: still counted from 100
    renewal = Record("other", 10, "2026-01-02T00:00:00.000000Z", "2026-01-02T03:00:02.000000Z", 3)
    second = observe(first, renewal, 105.0)
    assert second.since == 105.0
    assert next_step(second, "me", 114.0, WALL, TIMING).action == "wait"  # 10 s from 105, not from 100
    # A renew time far in the past (a holder whose clock is behind) changes nothing: only changes count.
    stale = Record("other", 10, None, "1999-01-01T00:00:00.000000Z", 3)
    assert next_step(observe(None, stale, 200.0), "me", 201.0, WALL, TIMING).action == "wait"


def test_the_holders_lease_duration_counts_not_the_waiters() -> None:
    long = Record("other", 60, None, None, 0)
    assert next_step(observe(None, long, 0.0), "me", 30.0, WALL, TIMING).action == "wait"


def test_the_holder_renews_keeping_its_acquire_time_and_transitions() -> None:
    mine = held("me")
    step = next_step(Seen(mine, 0.0), "me", 1000.0, WALL, TIMING)
    assert step.action == "update" and step.why == "renew"
    assert step.record == Record("me", 10, mine.acquire_time, STAMP, 3) == renewed(mine, WALL, TIMING)


def test_a_released_lease_is_taken_at_once() -> None:
    free = released(held("other"), WALL)
    assert free.holder == "" and free.lease_duration_s == 1 and free.transitions == 3
    step = next_step(observe(None, free, 50.0), "me", 50.0, WALL, TIMING)
    assert step.action == "update" and step.record is not None and step.record.holder == "me"
    assert step.why == "released by its last holder"


def test_lease_bodies_round_trip_and_carry_the_version_they_were_read_at() -> None:
    body = lease_body("ops", "rljob-leader", held("me"), "42")
    assert body["apiVersion"] == "coordination.k8s.io/v1" and body["kind"] == "Lease"
    assert body["metadata"] == {"name": "rljob-leader", "namespace": "ops", "resourceVersion": "42"}
    assert record_of(body) == held("me")
    assert record_of(None) is None
    nobody = lease_body("ops", "l", released(held("me"), WALL))
    assert "holderIdentity" not in nobody["spec"] and "resourceVersion" not in nobody["metadata"]
    assert record_of(nobody) is not None and record_of(nobody).holder == ""  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("timing", "words"),
    [
        (Timing(10, 7, 1), []),
        (Timing(15, 10, 2), []),  # client-go's defaults
        (Timing(10, 10, 1), ["shorter than the lease duration"]),
        (Timing(10, 12, 1), ["shorter than the lease duration"]),
        (Timing(10, 7, 6), ["longer than 1.2 times the retry period"]),
        (Timing(10.5, 7, 1), ["whole seconds"]),
        (Timing(10, 7, 0), ["positive"]),
    ],
)
def test_unsafe_timings_are_refused(timing: Timing, words: list[str]) -> None:
    problems = timing.problems()
    assert len(problems) == len(words), problems
    for problem, word in zip(problems, words, strict=True):
        assert word in problem
