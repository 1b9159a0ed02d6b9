"""A job's spec is validated once per generation (job.py, SpecCache), by its own passes and by the
quota passes of its namespace, which read every job; a spec edit (a new generation) or a job created
again under the same name (a new uid) is validated afresh, and a deleted job's spec is dropped."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import JOB, RAYJOB, Harness

from rljob_api.resource import parse_spec
from rljob_operator import job as job_module

JOBS = ("job-a", "job-b", "job-c")


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The specs validated, in order."""
    seen: list[dict[str, Any]] = []

    def counting(data: Any) -> Any:
        seen.append(data)
        return parse_spec(data)

    monkeypatch.setattr(job_module, "parse_spec", counting)
    return seen


def _queue() -> Harness:
    """Three 8-GPU jobs in a namespace whose quota admits one: every pass of each reads all three."""
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.set_quota(hard=8)
    for name in JOBS:
        h.kube.create_job(name)
    h.settle()
    return h


def test_each_spec_is_validated_once_however_many_passes_read_it(parsed: list[dict[str, Any]]) -> None:
    h = _queue()
    assert [h.status(name)["phase"] for name in JOBS] == ["Starting", "Queued", "Queued"]
    for _ in range(3):
        for name in JOBS:
            h.reconcile(name)
    assert h.passes() > 10
    assert len(parsed) == len(JOBS)


def test_a_new_generation_is_validated_again_and_used(parsed: list[dict[str, Any]]) -> None:
    h = _queue()
    h.kube.put(JOB, "ml", "job-a", {"spec": {"suspend": True}}, manager="kubectl-edit")
    h.settle()
    assert len(parsed) == len(JOBS) + 1
    assert parsed[-1]["suspend"] is True
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["suspend"] is True


def test_a_job_created_again_under_its_name_is_validated_again(parsed: list[dict[str, Any]]) -> None:
    h = _queue()
    h.kube.delete(JOB, "ml", "job-c")
    h.kube.create_job("job-c", {"rollout": {"temperature": 0.5}})  # generation 1 again, a new uid
    h.settle()
    assert len(parsed) == len(JOBS) + 1
    assert parsed[-1]["rollout"]["temperature"] == 0.5


def test_an_invalid_spec_is_not_kept(parsed: list[dict[str, Any]]) -> None:
    h = Harness()
    h.kube.put(JOB, "ml", "job-x", {"spec": {"model": {"path": "m"}, "unknown": 1}}, manager="kubectl")
    h.reconcile("job-x")
    h.reconcile("job-x")
    assert len(parsed) == 2
    assert [e[1] for e in h.events] == ["InvalidSpec", "InvalidSpec"]
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 1  # its lock only


def test_a_deleted_jobs_spec_is_dropped(parsed: list[dict[str, Any]]) -> None:
    h = _queue()
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 3
    for name in JOBS:
        h.kube.delete(JOB, "ml", name)
    h.settle()
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 0


def test_the_resync_drops_the_specs_of_jobs_it_does_not_list() -> None:
    h = _queue()
    h.reconciler.reapply_all({("ml", "job-a"), ("ml", "job-b")})  # job-c gone unseen
    assert h.reconciler._specs.jobs() == {("ml", "job-a"), ("ml", "job-b")}
