"""Status is a pure function of (job, observed children): phase, conditions kstatus can read,
messages a person can act on, progress left alone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from operator_fixtures import NOW, job_from_spec

from rljob_api.status import RLTrainingJobStatus
from rljob_operator.checks import Blocker
from rljob_operator.quota import Decision
from rljob_operator.status import (
    Observed,
    announcement,
    compute_status,
    decide_phase,
    denied_status,
    status_changed,
)


def rayjob(
    deployment: str = "", job_status: str = "", suspend: bool = False, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-a"},
        "spec": {"suspend": suspend},
        "status": {"jobDeploymentStatus": deployment, "jobStatus": job_status, **status},
    }


def conds(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def kstatus(status: dict[str, Any], generation: int = 1) -> str:
    """kstatus' reading of a status (sigs.k8s.io/cli-utils), for jobs that are not being deleted."""
    c = conds(status)
    if status.get("observedGeneration") != generation or c.get("Reconciling") == "True":
        return "InProgress"
    if c.get("Stalled") == "True":
        return "Failed"
    return "Current" if c.get("Ready") == "True" else "InProgress"


CASES = [
    ("first visit", Observed(NOW), "Pending", "InProgress"),
    ("quota", Observed(NOW, queue=Decision(False, "InsufficientQuota", "needs 16")), "Queued", "InProgress"),
    ("created", Observed(NOW, rayjob=rayjob("Initializing")), "Starting", "InProgress"),
    ("running", Observed(NOW, rayjob=rayjob("Running", "RUNNING")), "Running", "Current"),
    ("succeeded", Observed(NOW, rayjob=rayjob("Complete", "SUCCEEDED")), "Succeeded", "Current"),
    (
        "failed",
        Observed(NOW, rayjob=rayjob("Failed", "FAILED", reason="AppFailed", message="boom")),
        "Failed",
        "Failed",
    ),
    (
        "deadline",
        Observed(NOW, rayjob=rayjob("Failed", "", reason="DeadlineExceeded", message="too slow")),
        "Failed",
        "Failed",
    ),
    ("retrying", Observed(NOW, rayjob=rayjob("Retrying", "FAILED", failed=1)), "Starting", "InProgress"),
    (
        "missing secret",
        Observed(NOW, blocker=Blocker("SecretNotFound", "Secret 'hf' not found")),
        "Pending",
        "Failed",
    ),
    (
        "pod cannot start",
        Observed(
            NOW,
            rayjob=rayjob("Initializing"),
            pods=Blocker("CreateContainerConfigError", 'secret "hf" not found'),
        ),
        "Starting",
        "Failed",
    ),
    (
        "pod problem ignored once running",
        Observed(
            NOW,
            rayjob=rayjob("Running", "RUNNING"),
            pods=Blocker("CreateContainerConfigError", 'secret "hf" not found'),
        ),
        "Running",
        "Current",
    ),
    (
        "name too long",
        Observed(NOW, blocker=Blocker("NameTooLong", "too long", terminal=True)),
        "Failed",
        "Failed",
    ),
]


@pytest.mark.parametrize(("label", "seen", "phase", "kstatus_result"), CASES, ids=[c[0] for c in CASES])
def test_phases_and_kstatus(label: str, seen: Observed, phase: str, kstatus_result: str) -> None:
    status = compute_status(job_from_spec(), seen)
    assert status["phase"] == phase
    assert kstatus(status) == kstatus_result
    c = conds(status)
    assert set(c) == {"Ready", "Reconciling", "Stalled", "Queued", "Succeeded", "Failed", "Suspended"}
    assert (c["Succeeded"] == "True") == (phase == "Succeeded")
    assert (c["Failed"] == "True") == (phase == "Failed")
    assert (c["Queued"] == "True") == (phase == "Queued")
    assert all(cond["observedGeneration"] == 1 and cond["reason"] for cond in status["conditions"])
    assert "progress" not in status
    # Every field is declared in the CRD schema (undeclared ones would be pruned by the API server).
    RLTrainingJobStatus.model_validate(status)  # extra="forbid": an undeclared field fails here


def test_failure_carries_the_rayjob_reason_and_message() -> None:
    status = compute_status(
        job_from_spec(),
        Observed(
            NOW, rayjob=rayjob("Failed", "FAILED", reason="AppFailed", message="ValueError: bad reward")
        ),
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "AppFailed" and "ValueError: bad reward" in ready["message"]
    assert status["completionTime"] == "2026-11-22T12:00:00Z"


def test_suspend_and_kueue() -> None:
    suspended = job_from_spec({"suspend": True})
    assert decide_phase(suspended, Observed(NOW)).phase == "Suspended"
    assert (
        decide_phase(suspended, Observed(NOW, rayjob=rayjob("Suspended", suspend=True))).phase == "Suspended"
    )
    kueue = job_from_spec({"queueName": "team-a"})
    verdict = decide_phase(kueue, Observed(NOW, rayjob=rayjob("", suspend=True)))
    assert (verdict.phase, verdict.reason) == ("Queued", "WaitingForKueue") and "team-a" in verdict.message
    resuming = decide_phase(job_from_spec(), Observed(NOW, rayjob=rayjob("Suspended", suspend=True)))
    assert resuming.phase == "Starting" and resuming.reason == "Resuming"


def test_terminal_phase_is_sticky_after_children_are_cleaned_up() -> None:
    done = compute_status(job_from_spec(), Observed(NOW, rayjob=rayjob("Complete", "SUCCEEDED")))
    later = job_from_spec(status=done)
    assert compute_status(later, Observed(NOW + timedelta(hours=1)))["phase"] == "Succeeded"


def test_running_message_shows_progress_from_the_runtime() -> None:
    job = job_from_spec(status={"progress": {"stepText": "12/100", "rewardMean": 0.4567}})
    verdict = decide_phase(job, Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    assert verdict.message == "step 12/100, reward 0.457"


def test_unchanged_status_is_not_patched_and_transition_times_are_kept() -> None:
    seen = Observed(NOW, rayjob=rayjob("Running", "RUNNING"))
    first = compute_status(job_from_spec(), seen)
    job = job_from_spec(status={**first, "progress": {"step": 3}})
    again = compute_status(job, Observed(NOW + timedelta(minutes=5), rayjob=rayjob("Running", "RUNNING")))
    assert not status_changed(job.status, again)
    finished = compute_status(
        job, Observed(NOW + timedelta(minutes=9), rayjob=rayjob("Complete", "SUCCEEDED"))
    )
    assert status_changed(job.status, finished)
    times = {c["type"]: c["lastTransitionTime"] for c in finished["conditions"]}
    assert times["Ready"] == "2026-11-22T12:00:00Z"  # Ready stayed True
    assert times["Succeeded"] == "2026-11-22T12:09:00Z"


def test_children_gpus_and_restarts() -> None:
    job = job_from_spec({"resources": {"colocate": False, "rollout": {"gpus": 8}}, "queueName": "q"})
    status = compute_status(
        job, Observed(NOW, rayjob=rayjob("Running", "RUNNING", rayClusterName="job-a-x7k2p", failed=1))
    )
    assert status["children"] == {
        "serviceAccount": "job-a-runtime",
        "rayJob": "job-a",
        "rayCluster": "job-a-x7k2p",
    }
    assert status["gpus"] == 16 and status["restarts"] == 1 and status["queue"] == "q"


def test_a_denied_permission_stalls_the_job_and_keeps_everything_else() -> None:
    running = compute_status(job_from_spec(), Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    job = job_from_spec(status={**running, "progress": {"step": 3}})
    denied = denied_status(job, "the operator is not allowed to get rayjobs.ray.io", NOW + timedelta(1))
    assert denied["phase"] == "Running" and "progress" not in denied  # the runtime owns progress
    assert {k: v for k, v in denied.items() if k != "conditions"} == {
        k: v for k, v in running.items() if k != "conditions"
    }
    stalled = next(c for c in denied["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "PermissionDenied"
    assert "not allowed to get rayjobs.ray.io" in stalled["message"]
    assert kstatus(denied) == "Failed"


def test_every_phase_change_and_every_new_blocker_is_announced() -> None:
    job = job_from_spec()
    pending = compute_status(job, Observed(NOW))
    assert announcement({}, pending) == (
        "Normal",
        "Creating",
        "New -> Pending: creating the RayJob and the runtime's ServiceAccount",
    )
    stuck = compute_status(
        job_from_spec(status=pending), Observed(NOW, blocker=Blocker("NoNodeFits", "no node"))
    )
    assert announcement(pending, stuck) == ("Warning", "NoNodeFits", "Pending: no node")  # same phase
    assert announcement(stuck, stuck) is None
    running = compute_status(job, Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    event = announcement(stuck, running)
    assert event is not None and event[0] == "Normal" and event[2].startswith("Pending -> Running: ")
