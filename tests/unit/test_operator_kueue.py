"""Kueue's share of the operator (kueue.py, the builders' labels, the API's priority field): which
jobs Kueue admits, what a RayJob says about its admission, and the labels Kueue reads."""

from __future__ import annotations

import pytest
from operator_fixtures import job_from_spec

from rljob_api.errors import SpecError
from rljob_api.resource import check_update, parse_spec
from rljob_operator.build import BuildSettings, build_conversion_rayjob, build_rayjob
from rljob_operator.conversions import export_conversion
from rljob_operator.kueue import held_by_kueue, kueue_admits, local_queue, waiting_message
from rljob_operator.names import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL

from spec_cases import BASE_SPEC, patched

MANAGED = BuildSettings(kueue_manage_jobs_without_queue_name=True)


def _rayjob(suspend: bool | None, **labels: str) -> dict:
    spec = {} if suspend is None else {"suspend": suspend}
    return {"metadata": {"name": "job-a", "labels": labels}, "spec": spec, "status": {}}


@pytest.mark.parametrize(
    ("patch", "manage", "admits"),
    [
        ({}, False, False),
        ({"queueName": "team-a"}, False, True),
        ({}, True, True),
        ({"queueName": "team-a"}, True, True),
    ],
)
def test_kueue_admits_jobs_with_a_queue_and_with_its_manage_setting_every_job(
    patch: dict, manage: bool, admits: bool
) -> None:
    assert kueue_admits(job_from_spec(patch), manage) is admits


def test_the_local_queue_is_the_jobs_else_the_one_kueues_webhook_chose() -> None:
    assert local_queue(job_from_spec({"queueName": "team-a"}), None) == "team-a"
    assert (
        local_queue(job_from_spec({"queueName": "team-a"}), _rayjob(True, **{KUEUE_QUEUE_LABEL: "x"}))
        == "team-a"
    )
    assert local_queue(job_from_spec(), _rayjob(True, **{KUEUE_QUEUE_LABEL: "default"})) == "default"
    assert local_queue(job_from_spec(), _rayjob(True)) is None
    assert local_queue(job_from_spec(), None) is None


def test_a_suspended_rayjob_of_a_job_that_is_not_suspended_is_held_by_kueue() -> None:
    assert held_by_kueue(job_from_spec(), _rayjob(True))
    assert not held_by_kueue(job_from_spec(), _rayjob(False))
    assert not held_by_kueue(job_from_spec(), _rayjob(None))  # Kueue's `false` is omitted (omitempty)
    assert not held_by_kueue(job_from_spec({"suspend": True}), _rayjob(True))
    # KubeRay still shows Suspended after Kueue admitted a queued job: still Kueue's turn.
    assert held_by_kueue(job_from_spec({"queueName": "team-a"}), _rayjob(None))


def test_the_waiting_message_names_the_queue_or_what_to_do() -> None:
    assert waiting_message("team-a") == "waiting for Kueue to admit the RayJob in LocalQueue 'team-a'"
    message = waiting_message(None)
    assert "no LocalQueue" in message and "spec.queueName" in message and "'default'" in message


def test_the_rayjob_carries_the_queue_and_priority_labels_kueue_reads() -> None:
    job = job_from_spec({"queueName": "team-a", "workloadPriorityClassName": "high"})
    labels = build_rayjob(job, BuildSettings(), suspend=None)["metadata"]["labels"]
    assert (labels[KUEUE_QUEUE_LABEL], labels[KUEUE_PRIORITY_LABEL]) == ("team-a", "high")
    plain = build_rayjob(job_from_spec(), MANAGED, suspend=None)["metadata"]["labels"]
    assert KUEUE_QUEUE_LABEL not in plain and KUEUE_PRIORITY_LABEL not in plain


def test_conversions_go_through_the_jobs_queue_only_when_kueue_manages_every_job() -> None:
    job = job_from_spec({"queueName": "team-a"})
    want = export_conversion(job, 1)
    assert KUEUE_QUEUE_LABEL not in build_conversion_rayjob(job, BuildSettings(), want)["metadata"]["labels"]
    assert build_conversion_rayjob(job, MANAGED, want)["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"


def test_the_priority_class_can_change_but_not_go_away() -> None:
    """Kueue refuses a RayJob update that drops kueue.x-k8s.io/priority-class (jobframework
    ValidateUpdateForWorkloadPriorityClassName): the API server refuses it on the job first."""
    high = parse_spec(patched({"workloadPriorityClassName": "high"}))
    low = parse_spec(patched({"workloadPriorityClassName": "low"}))
    none = parse_spec(BASE_SPEC)
    assert check_update(none, high) == [] and check_update(high, low) == []
    (problem,) = check_update(high, none)
    assert "workloadPriorityClassName cannot be removed" in problem
    with pytest.raises(SpecError):
        parse_spec(patched({"workloadPriorityClassName": "Not_A_Label"}))
