"""A starting job whose pods are stuck says why in the pass that sees it (reason on the conditions,
a Warning event, the Ready message of `-o wide`), is Stalled once faultTolerance.startupTimeoutSeconds
has passed (or Failed, with its RayJob suspended so the pods free their quota), and goes on by
itself when the cause clears."""

from __future__ import annotations

from typing import Any

from fake_kube import RAYJOB, Harness

PULL = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "rljob/runtime:test"'}
NO_FIT = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: not eligible."


def _starting(patch: dict[str, Any] | None = None) -> Harness:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a", patch)
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Starting"
    return h


def _shown(h: Harness) -> tuple[str, str, str, str]:
    """(phase, Ready reason, Reconciling status, Stalled status)."""
    return (
        h.status("job-a")["phase"],
        h.condition("job-a", "Ready")["reason"],
        h.condition("job-a", "Reconciling")["status"],
        h.condition("job-a", "Stalled")["status"],
    )


def test_an_image_pull_failure_shows_at_once_stalls_after_the_timeout_and_clears() -> None:
    h = _starting()
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, waiting=PULL)
    h.reconcile("job-a")  # the pod event's pass
    assert _shown(h) == ("Starting", "ImagePullBackOff", "True", "False")  # may clear by itself
    ready = h.condition("job-a", "Ready")["message"]
    assert ready.startswith(
        "pod job-a-gpu-0 cannot pull image 'rljob/runtime:test' for container 'ray-worker'"
    )
    assert h.events[-1] == ("Warning", "ImagePullBackOff", f"Starting: {ready}")
    events = len(h.events)
    h.kube.advance(599)
    h.reconcile("job-a")  # a resync before the deadline: nothing new
    assert _shown(h)[3] == "False" and len(h.events) == events
    h.kube.advance(2)
    h.reconcile("job-a")
    assert _shown(h) == ("Starting", "ImagePullBackOff", "False", "True")
    stalled = h.condition("job-a", "Stalled")
    assert stalled["reason"] == "ImagePullBackOff"
    assert stalled["message"].endswith("Stuck for over 600 s (faultTolerance.startupTimeoutSeconds).")
    assert h.events[-1][:2] == ("Warning", "ImagePullBackOff") and len(h.events) == events + 1
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, phase="Running")  # the registry came back
    h.reconcile("job-a")
    assert _shown(h) == ("Starting", "Starting", "True", "False")


def test_an_unschedulable_pod_quotes_the_scheduler() -> None:
    h = _starting({"faultTolerance": {"startupTimeoutSeconds": 60}})
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, unschedulable=NO_FIT)
    h.reconcile("job-a")
    assert _shown(h) == ("Starting", "Unschedulable", "True", "False")
    message = h.condition("job-a", "Ready")["message"]
    assert f"pod job-a-gpu-0 cannot be scheduled: {NO_FIT.rstrip('.')}" in message
    assert "It requests nvidia.com/gpu=8" in message
    h.kube.advance(61)
    h.reconcile("job-a")
    assert _shown(h)[3] == "True"


def test_pod_creation_refused_by_a_quota_is_read_from_the_rayjob() -> None:
    h = _starting()
    refused = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreateWorkerPod",
        "message": 'FailedCreateWorkerPod\npods "job-a-gpu-x" is forbidden: exceeded quota: compute, '
        "requested: pods=1, used: pods=1, limited: pods=1",
        "lastTransitionTime": h.kube.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    h.kube.set_rayjob_status(
        "job-a",
        jobDeploymentStatus="Initializing",
        rayClusterStatus={"desiredWorkerReplicas": 1, "readyWorkerReplicas": 0, "conditions": [refused]},
    )
    h.reconcile("job-a")  # the RayJob event's pass
    assert _shown(h) == ("Starting", "QuotaExceeded", "True", "False")
    assert "ResourceQuota 'compute' refuses them" in h.condition("job-a", "Ready")["message"]
    assert h.events[-1][:2] == ("Warning", "QuotaExceeded")


def test_a_crash_looping_head_names_its_restarts() -> None:
    h = _starting()
    h.kube.add_pod(
        "job-a",
        "job-a-head",
        role="head",
        phase="Running",
        waiting={"reason": "CrashLoopBackOff", "message": "back-off 40s"},
        restartCount=4,
        lastState={"terminated": {"reason": "Error", "exitCode": 1}},
    )
    h.reconcile("job-a")
    assert _shown(h)[1] == "CrashLoopBackOff"
    assert h.condition("job-a", "Ready")["message"].startswith(
        "the Ray head (pod job-a-head) keeps crashing: container 'ray-worker' restarted 4 times, last ended "
        "with Error, exit code 1."
    )


def test_on_startup_timeout_fail_fails_the_job_and_suspends_its_rayjob() -> None:
    h = _starting({"faultTolerance": {"startupTimeoutSeconds": 60, "onStartupTimeout": "Fail"}})
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, unschedulable=NO_FIT)
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Starting"
    h.kube.advance(61)
    h.reconcile("job-a")
    failed = h.condition("job-a", "Failed")
    assert (h.status("job-a")["phase"], failed["status"], failed["reason"]) == (
        "Failed",
        "True",
        "Unschedulable",
    )
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["suspend"] is True  # KubeRay deletes the pods
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Suspended")
    writes = len(h.kube.calls_to("apply", "apply_job_status"))
    h.reconcile("job-a")  # final: nothing re-created, nothing rewritten
    assert h.status("job-a")["phase"] == "Failed"
    assert len(h.kube.calls_to("apply", "apply_job_status")) == writes
