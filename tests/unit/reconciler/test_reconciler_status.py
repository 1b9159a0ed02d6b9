"""Status follows the RayJob as KubeRay reports it, one event per phase change; an unchanged job
costs no write, and a running job's pass no list call."""

from __future__ import annotations

from fake_kube import RAYJOB, Harness

PROGRESS = {"step": 120, "numRollout": 3000, "stepText": "120/3000", "rewardMean": 0.47}


def _started() -> Harness:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a")
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Starting"
    return h


def _phase_events(h: Harness) -> list[str]:
    return [message.split(":")[0] for _, _, message in h.events if " -> " in message]


def test_kuberays_status_moves_the_job_from_starting_to_succeeded() -> None:
    h = _started()
    h.kube.set_rayjob_status(
        "job-a",
        jobDeploymentStatus="Initializing",
        rayClusterName="job-a-raycluster-x7k2p",
        rayClusterStatus={"desiredWorkerReplicas": 1, "readyWorkerReplicas": 0},
    )
    h.reconcile("job-a")
    assert h.condition("job-a", "Ready")["message"] == "Ray cluster starting: 0/1 worker pods ready"
    assert h.status("job-a")["children"]["rayCluster"] == "job-a-raycluster-x7k2p"
    h.kube.set_rayjob_status(
        "job-a", jobDeploymentStatus="Running", jobStatus="RUNNING", startTime="2026-11-22T10:05:00Z"
    )
    h.reconcile("job-a")
    assert (h.status("job-a")["phase"], h.status("job-a")["startTime"]) == ("Running", "2026-11-22T10:05:00Z")
    h.kube.report_progress("job-a", PROGRESS)  # the runtime, under its own field manager
    h.reconcile("job-a")
    assert h.condition("job-a", "Ready")["message"] == "step 120/3000, reward 0.47"
    h.kube.set_rayjob_status(
        "job-a", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", endTime="2026-11-22T13:00:00Z"
    )
    h.reconcile("job-a")
    status = h.status("job-a")
    assert (status["phase"], status["completionTime"]) == ("Succeeded", "2026-11-22T13:00:00Z")
    assert status["progress"] == PROGRESS  # the operator's status applies leave the runtime's field
    assert _phase_events(h) == [
        "New -> Pending",
        "Pending -> Starting",
        "Starting -> Running",
        "Running -> Succeeded",
    ]
    assert [reason for _, reason, _ in h.events] == [
        "Creating",
        "Created",
        "Starting",
        "Running",
        "Completed",
    ]

    before = len(h.kube.calls)
    h.reconcile("job-a")  # nothing changed
    assert [c.method for c in h.kube.calls[before:]] == ["get_job", "get_rayjob"]
    h.kube.delete(RAYJOB, "ml", "job-a")  # KubeRay's ttlSecondsAfterFinished
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Succeeded"
    assert h.kube.calls_to("apply_job_status")[-1].args[2]["phase"] == "Succeeded"


def test_an_unchanged_job_is_not_written() -> None:
    h = _started()
    writes, events = len(h.kube.calls_to("apply_job_status")), len(h.events)
    resource_version = (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["resourceVersion"]
    h.reconcile("job-a")
    assert len(h.kube.calls_to("apply_job_status")) == writes and len(h.events) == events
    # The children are re-applied every pass; unchanged, they are not modified.
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["resourceVersion"] == resource_version


def test_a_running_jobs_pass_makes_no_list_call() -> None:
    h = _started()
    h.kube.set_quota(hard=8, used=8)
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    before = len(h.kube.calls)
    h.reconcile("job-a")
    assert not [c.method for c in h.kube.calls[before:] if c.method.startswith("list_")]


def test_a_rayjob_deleted_behind_the_operators_back_is_recreated_and_announced_as_such() -> None:
    h = _started()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Running"
    old_uid = (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"]
    h.kube.delete(RAYJOB, "ml", "job-a")  # `kubectl delete rayjob`, a cleanup script
    h.reconcile("job-a")
    new = h.kube.get(RAYJOB, "ml", "job-a")
    assert new is not None and new["metadata"]["uid"] != old_uid
    (recreated,) = [e for e in h.events if e[1] == "Recreated"]
    kind, _, message = recreated
    assert kind == "Warning"
    assert message.startswith("RayJob job-a was deleted, not by this operator; recreated it")
    # Only the first RayJob was "created": the replacement is not announced as a new job's.
    assert [r for _, r, _ in h.events].count("Created") == 1


def test_a_running_job_on_a_node_that_stopped_reporting_shows_why_and_recovers() -> None:
    """The kubelet of the head's node stops: the node lifecycle controller sets its Ready condition
    Unknown. The job stays Running but says which pod and node, with Ready=False and Reconciling=True
    (kstatus: in progress), in a Warning event; when the node is back, Running again."""
    h = _started()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.kube.add_pod("job-a", "job-a-head-x", phase="Running", role="head", node="gpu-0")
    h.kube.add_pod("job-a", "job-a-worker-y", phase="Running", node="gpu-0")
    h.reconcile("job-a")
    assert h.condition("job-a", "Ready")["reason"] == "Running"
    h.kube.set_node_ready("gpu-0", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
    h.reconcile("job-a")
    status = h.status("job-a")
    ready, reconciling = h.condition("job-a", "Ready"), h.condition("job-a", "Reconciling")
    assert status["phase"] == "Running" and ready["status"] == "False" and reconciling["status"] == "True"
    assert ready["reason"] == reconciling["reason"] == "NodeNotReady"
    message = ready["message"]
    assert message.startswith(
        "the Ray head (pod job-a-head-x) is on node gpu-0, which is not Ready since "
    ), message
    assert message.split(" since ")[1].split()[0].count(":") == 2, message  # the time it stopped, HH:MM:SS
    assert (
        "(NodeStatusUnknown: Kubelet stopped posting node status) (1 other pod of the job on not-Ready"
        in message
    )
    assert "kubectl describe node gpu-0" in ready["message"]
    assert h.condition("job-a", "Stalled")["status"] == "False"
    kind, reason, message = h.events[-1]
    assert (kind, reason) == ("Warning", "NodeNotReady") and message.startswith("Running: the Ray head"), (
        h.events[-1]
    )

    h.kube.set_node_ready("gpu-0", "True", "KubeletReady", "kubelet is posting ready status")
    h.reconcile("job-a")
    assert (
        h.condition("job-a", "Ready")["status"] == "True"
        and h.condition("job-a", "Ready")["reason"] == "Running"
    )
    assert h.events[-1][:2] == ("Normal", "Running")


def test_a_not_ready_node_without_the_jobs_pods_changes_nothing() -> None:
    h = _started()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.kube.add_node("gpu-1")
    h.kube.add_pod("job-a", "job-a-head-x", phase="Running", role="head", node="gpu-0")
    h.kube.set_node_ready("gpu-1", "False", "KubeletNotReady", "container runtime is down")
    h.reconcile("job-a")
    assert h.condition("job-a", "Ready")["status"] == "True"
