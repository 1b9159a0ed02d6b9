"""Status is a pure function of (job, observed children): phase, conditions kstatus can read,
messages a person can act on, progress left alone."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from operator_fixtures import NOW, job_from_spec

from rljob_api.status import RLTrainingJobStatus
from rljob_operator.checks import Blocker
from rljob_operator.pod_states import Stuck
from rljob_operator.quota import Decision
from rljob_operator.status import (
    Observed,
    announcement,
    compute_status,
    decide_phase,
    error_status,
    holds_pods,
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
    (
        "larger than the quota",
        Observed(NOW, queue=Decision(False, "QuotaTooSmall", "never fits", impossible=True)),
        "Pending",
        "Failed",
    ),
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
            pods=Stuck("CreateContainerConfigError", 'secret "hf" not found', NOW, stalls_at_once=True),
        ),
        "Starting",
        "Failed",
    ),
    (
        "image pull failing, before the startup timeout",
        Observed(NOW, rayjob=rayjob("Initializing"), pods=Stuck("ImagePullBackOff", "cannot pull", NOW)),
        "Starting",
        "InProgress",
    ),
    (
        "pod problem ignored once running",
        Observed(
            NOW,
            rayjob=rayjob("Running", "RUNNING"),
            pods=Stuck("CreateContainerConfigError", 'secret "hf" not found', NOW, stalls_at_once=True),
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
    RLTrainingJobStatus.model_validate_json(json.dumps(status))  # extra="forbid": undeclared fields fail


RAY_FAILED = (
    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    "Traceback (most recent call last):\n  ...\nValueError: bad reward\n"
    "rljob: reward function 'math' raised ValueError: bad reward\n"
)


def test_failure_shows_the_runtimes_last_line_and_keeps_kuberays_whole_message() -> None:
    status = compute_status(
        job_from_spec(),
        Observed(NOW, rayjob=rayjob("Failed", "FAILED", reason="AppFailed", message=RAY_FAILED)),
    )
    ready, failed = cond(status, "Ready"), cond(status, "Failed")
    assert (ready["reason"], failed["reason"]) == ("AppFailed", "AppFailed")
    assert ready["message"] == "rljob: reward function 'math' raised ValueError: bad reward"  # -o wide
    assert failed["message"].startswith(
        "rljob: reward function 'math' raised ValueError: bad reward (RayJob job-a)"
    )
    assert "Traceback (most recent call last)" in failed["message"]
    assert status["completionTime"] == "2026-11-22T12:00:00Z"
    one_line = compute_status(
        job_from_spec(),
        Observed(NOW, rayjob=rayjob("Failed", "", reason="DeadlineExceeded", message="too slow")),
    )
    assert cond(one_line, "Ready")["message"] == "too slow"
    assert cond(one_line, "Failed")["message"] == "too slow (RayJob job-a)"


def test_each_condition_carries_its_own_reason() -> None:
    stuck = Stuck("ImagePullBackOff", "cannot pull image", NOW - timedelta(hours=1))
    status = compute_status(job_from_spec(), Observed(NOW, rayjob=rayjob("Initializing"), pods=stuck))
    reasons = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert reasons == {
        "Ready": ("False", "ImagePullBackOff"),
        "Reconciling": ("False", "Stalled"),
        "Stalled": ("True", "ImagePullBackOff"),
        "Queued": ("False", "NotQueued"),
        "Succeeded": ("False", "NotFinished"),
        "Failed": ("False", "NotFailed"),
        "Suspended": ("False", "NotSuspended"),
    }
    failed = compute_status(
        job_from_spec(), Observed(NOW, rayjob=rayjob("Failed", "FAILED", reason="AppFailed"))
    )
    assert (
        cond(failed, "Succeeded")["reason"] == "Failed" and cond(failed, "Reconciling")["reason"] == "Stalled"
    )


def test_a_stuck_pod_shows_at_once_and_stalls_after_the_startup_timeout() -> None:
    job = job_from_spec({"faultTolerance": {"startupTimeoutSeconds": 300}})
    stuck = Stuck("Unschedulable", "pod w-0 cannot be scheduled: 0/8 nodes are available", NOW)
    early = decide_phase(
        job, Observed(NOW + timedelta(seconds=299), rayjob=rayjob("Initializing"), pods=stuck)
    )
    assert (early.phase, early.reason, early.stalled) == ("Starting", "Unschedulable", False)
    assert early.message == stuck.message
    late = decide_phase(
        job, Observed(NOW + timedelta(seconds=300), rayjob=rayjob("Initializing"), pods=stuck)
    )
    assert (late.phase, late.reason, late.stalled) == ("Starting", "Unschedulable", True)
    assert late.message.endswith("Stuck for over 300 s (faultTolerance.startupTimeoutSeconds).")
    failing = job_from_spec({"faultTolerance": {"startupTimeoutSeconds": 300, "onStartupTimeout": "Fail"}})
    failed = decide_phase(
        failing, Observed(NOW + timedelta(hours=1), rayjob=rayjob("Initializing"), pods=stuck)
    )
    assert (failed.phase, failed.reason) == ("Failed", "Unschedulable")
    # A cause only a person can clear stalls at once; unknown `since` never times out.
    at_once = Stuck("CreateContainerConfigError", "secret missing", NOW, stalls_at_once=True)
    assert decide_phase(job, Observed(NOW, rayjob=rayjob("Initializing"), pods=at_once)).stalled
    never = Stuck("ImagePullBackOff", "cannot pull", None)
    assert not decide_phase(
        job, Observed(NOW + timedelta(days=9), rayjob=rayjob("Initializing"), pods=never)
    ).stalled


def test_a_job_failed_by_its_startup_timeout_stays_failed_and_its_rayjob_is_suspended() -> None:
    job = job_from_spec({"faultTolerance": {"onStartupTimeout": "Fail"}})
    stuck = Stuck("ImagePullBackOff", "cannot pull", NOW - timedelta(hours=1))
    starting = rayjob("Initializing")
    failed = compute_status(job, Observed(NOW, rayjob=starting, pods=stuck))
    assert failed["phase"] == "Failed" and holds_pods(failed, starting)
    suspended = rayjob("Suspended", suspend=True)
    assert not holds_pods(failed, suspended)
    later = compute_status(
        job_from_spec(status=failed), Observed(NOW + timedelta(minutes=1), rayjob=suspended)
    )
    assert later["phase"] == "Failed" and not status_changed(failed, later)
    assert not holds_pods(failed, rayjob("Failed", "FAILED"))  # KubeRay already cleaned up
    running = compute_status(job, Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    assert not holds_pods(running, rayjob("Running", "RUNNING"))


def test_a_resumed_job_waiting_for_quota_says_so() -> None:
    waiting = Decision(False, "InsufficientQuota", "needs 8 nvidia.com/gpu")
    verdict = decide_phase(
        job_from_spec(), Observed(NOW, rayjob=rayjob("Suspended", suspend=True), queue=waiting)
    )
    assert (verdict.phase, verdict.reason) == ("Queued", "InsufficientQuota")
    assert verdict.message == "resuming once admitted: needs 8 nvidia.com/gpu"


def test_kuberay_retries_show_with_their_count() -> None:
    job = job_from_spec({"faultTolerance": {"backoffLimit": 3}})
    verdict = decide_phase(
        job, Observed(NOW, rayjob=rayjob("Retrying", "FAILED", failed=2, message="a\nboom"))
    )
    assert (verdict.phase, verdict.reason) == ("Starting", "Retrying")
    assert "(retry 2 of 3)" in verdict.message and verdict.message.endswith(": boom")


def test_suspend_and_kueue() -> None:
    suspended = job_from_spec({"suspend": True})
    assert decide_phase(suspended, Observed(NOW)).phase == "Suspended"
    assert (
        decide_phase(suspended, Observed(NOW, rayjob=rayjob("Suspended", suspend=True))).phase == "Suspended"
    )
    kueue = job_from_spec({"queueName": "team-a"})
    verdict = decide_phase(kueue, Observed(NOW, rayjob=rayjob("", suspend=True)))
    assert (verdict.phase, verdict.reason) == ("Queued", "WaitingForKueue") and "team-a" in verdict.message
    resuming = decide_phase(job_from_spec(), Observed(NOW, rayjob=rayjob("Suspended", suspend=False)))
    assert resuming.phase == "Starting" and resuming.reason == "Resuming"


def test_a_rayjob_held_suspended_without_a_queue_name_waits_for_kueue() -> None:
    """The operator suspends the RayJob of a job that is not suspended only while its GPU quota holds
    it (Queued before this is read): anyone else holding it is Kueue (manageJobsWithoutQueueName)."""
    job = job_from_spec()
    held = rayjob("Suspended", suspend=True)
    verdict = decide_phase(job, Observed(NOW, rayjob=held))
    assert (verdict.phase, verdict.reason) == ("Queued", "WaitingForKueue")
    assert "no LocalQueue" in verdict.message and "spec.queueName" in verdict.message
    assert "queue" not in compute_status(job, Observed(NOW, rayjob=held))
    # Kueue's webhook put it in the namespace's LocalQueue named "default".
    held["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "default"}
    verdict = decide_phase(job, Observed(NOW, rayjob=held))
    assert verdict.message == "waiting for Kueue to admit the RayJob in LocalQueue 'default'"
    status = compute_status(job, Observed(NOW, rayjob=held))
    assert status["queue"] == "default" and status["phase"] == "Queued"


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


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_a_denied_permission_stalls_the_job_and_keeps_everything_else() -> None:
    running = compute_status(job_from_spec(), Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    job = job_from_spec(status={**running, "progress": {"step": 3}})
    message = "the operator is not allowed to get rayjobs.ray.io"
    denied = error_status(job, "PermissionDenied", message, NOW + timedelta(1), stalled=True)
    assert denied["phase"] == "Running" and "progress" not in denied  # the runtime owns progress
    assert {k: v for k, v in denied.items() if k != "conditions"} == {
        k: v for k, v in running.items() if k != "conditions"
    }
    stalled = next(c for c in denied["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "PermissionDenied"
    assert "not allowed to get rayjobs.ray.io" in stalled["message"]
    assert kstatus(denied) == "Failed"
    assert cond(denied, "Ready") == cond(running, "Ready")  # still running: the column keeps its step


def test_a_retried_error_shows_on_a_job_that_is_not_ready_yet() -> None:
    pending = compute_status(job_from_spec(), Observed(NOW))
    job = job_from_spec(status=pending)
    retrying = error_status(job, "Retrying", "retrying (attempt 2) in 2 s: API error 500", NOW, stalled=False)
    assert retrying["phase"] == "Pending"
    for kind in ("Ready", "Reconciling"):
        assert (cond(retrying, kind)["reason"], cond(retrying, kind)["message"]) == (
            "Retrying",
            "retrying (attempt 2) in 2 s: API error 500",
        )
    assert cond(retrying, "Stalled")["status"] == "False" and kstatus(retrying) == "InProgress"
    assert announcement(pending, retrying) == (
        "Warning",
        "Retrying",
        "Pending: retrying (attempt 2) in 2 s: API error 500",
    )


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
    starting = compute_status(job, Observed(NOW, rayjob=rayjob("Initializing")))
    pulling = Stuck("ImagePullBackOff", "cannot pull", NOW)
    shown = compute_status(
        job_from_spec(status=starting), Observed(NOW, rayjob=rayjob("Initializing"), pods=pulling)
    )
    assert announcement(starting, shown) == ("Warning", "ImagePullBackOff", "Starting: cannot pull")
    later = NOW + timedelta(hours=1)
    stalled = compute_status(
        job_from_spec(status=shown), Observed(later, rayjob=rayjob("Initializing"), pods=pulling)
    )
    event = announcement(shown, stalled)  # same reason, but now Stalled: told once more
    assert event is not None and event[:2] == ("Warning", "ImagePullBackOff") and "Stuck for over" in event[2]
    assert announcement(stalled, stalled) is None
    running = compute_status(job, Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    event = announcement(stuck, running)
    assert event is not None and event[0] == "Normal" and event[2].startswith("Pending -> Running: ")
