"""catch_up.py: at start, the operator announces the phase change its predecessor wrote but did not
announce (it ended between the status write and the event), and nothing else."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from rljob_operator import catch_up
from rljob_operator.catch_up import last_announced, missing

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def job(
    name: str, phase: str | None, *, age: timedelta = timedelta(minutes=5), **extra: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase:
        ready = "True" if phase in ("Running", "Succeeded") else "False"
        status = {
            "phase": phase,
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": f"{phase}Reason",
                    "message": f"{name} is {phase}",
                },
                {"type": "Stalled", "status": "True" if phase == "Failed" else "False", "reason": "r"},
            ],
        }
    meta = {
        "name": name,
        "namespace": "ml",
        "uid": f"uid-{name}",
        "creationTimestamp": stamp(NOW - age),
        **extra,
    }
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": meta, "status": status}


def event(uid: str, message: str, at: str) -> dict[str, Any]:
    return {"involvedObject": {"uid": uid}, "message": message, "eventTime": at}


def test_the_newest_phase_change_of_each_job_counts() -> None:
    events = [
        event("uid-a", "Starting -> Running: up", "2026-05-01T11:00:02.000001Z"),
        event("uid-a", "New -> Pending: accepted", "2026-05-01T11:00:00.000000Z"),
        event("uid-a", "Running: a reason within the phase", "2026-05-01T11:00:09.000000Z"),
        event("uid-a", "Pending -> Starting: RayJob created", "2026-05-01T11:00:01.000000Z"),
        event("uid-b", "New -> Queued: waiting for 8 GPUs", "2026-05-01T11:00:00.000000Z"),
        {"involvedObject": {}, "message": "New -> Pending: x", "eventTime": "2026-05-01T11:00:00.000000Z"},
    ]
    assert last_announced(events) == {"uid-a": "Running", "uid-b": "Queued"}


def test_the_one_unannounced_change_is_announced_as_the_pass_would_have() -> None:
    announced = {"uid-a": "Pending", "uid-b": "Running", "uid-c": "Running"}
    jobs = [job("a", "Starting"), job("b", "Running"), job("c", "Failed")]
    found = {j["metadata"]["name"]: e for j, e in missing(jobs, announced, NOW)}
    assert found == {
        "a": ("Normal", "StartingReason", "Pending -> Starting: a is Starting"),
        "c": ("Warning", "FailedReason", "Running -> Failed: c is Failed"),
    }


def test_a_young_job_without_any_announcement_gets_its_first() -> None:
    (found,) = missing([job("new", "Pending", age=timedelta(seconds=30))], {}, NOW)
    assert found[1][2] == "New -> Pending: new is Pending"


@pytest.mark.parametrize(
    "quiet",
    [
        job("old", "Running", age=timedelta(hours=3)),  # its announcements may have expired
        job("unseen", None),  # no operator has written its status yet
        job("going", "Running", deletionTimestamp=stamp(NOW)),
        {**job("odd", None), "status": {"phase": "Running"}},  # no Ready condition: not the operator's shape
    ],
    ids=["old", "no-status", "deleting", "no-ready"],
)
def test_nothing_is_said_where_nothing_is_known_to_be_missing(quiet: dict[str, Any]) -> None:
    assert missing([quiet], {}, NOW) == []


def test_the_catch_up_posts_what_is_missing_and_never_stops_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[tuple[str, str]] = []
    fail: list[bool] = [False]

    class FakeKube:
        async def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
            if fail[0]:
                raise ApiException(status=403, reason="Forbidden")
            return [job("a", "Starting", age=timedelta(0)), job("b", "Running", age=timedelta(0))]

        async def list_operator_events(self, namespace: str | None) -> list[dict[str, Any]]:
            return [event("uid-a", "New -> Pending: ok", "t"), event("uid-b", "Starting -> Running: ok", "t")]

        async def post_event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
            posted.append((obj["metadata"]["name"], message))

        async def close(self) -> None:
            pass

    async def no_config() -> None:
        pass

    monkeypatch.setattr(catch_up, "load_config", no_config)
    monkeypatch.setattr(catch_up, "EventsKube", FakeKube)
    assert asyncio.run(catch_up.announce_missing(())) == 1
    assert posted == [("a", "Pending -> Starting: a is Starting")]
    fail[0] = True
    assert asyncio.run(catch_up.announce_missing(("ml",))) == 0  # logged, not raised
