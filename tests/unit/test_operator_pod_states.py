"""Why a starting job is stuck, from its pods and its RayJob: one reason, and a message that names
what is wrong and what to do. The shapes are what the kubelet, the scheduler and KubeRay v1.6.1 write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rljob_operator.pod_states import (
    NODE_NOT_READY,
    REASONS,
    NodeDown,
    Stuck,
    classify,
    node_trouble,
    not_ready,
)

CREATED = "2026-11-22T10:00:00Z"
T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)


def pod(
    name: str,
    *,
    role: str = "gpu",
    waiting: dict[str, str] | None = None,
    init: bool = False,
    conditions: list[dict[str, Any]] | None = None,
    **container: Any,
) -> dict[str, Any]:
    state = {"waiting": waiting} if waiting else {"running": {}}
    statuses = [{"name": "ray-worker", "image": "rljob/runtime:1.0", "state": state, **container}]
    status: dict[str, Any] = {"phase": "Pending", "conditions": conditions or []}
    status["initContainerStatuses" if init else "containerStatuses"] = statuses
    return {
        "metadata": {"name": name, "creationTimestamp": CREATED, "labels": {"rljob.dev/role": role}},
        "spec": {
            "containers": [
                {"name": "ray-worker", "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "4"}}}
            ]
        },
        "status": status,
    }


def rayjob_with_replica_failure(reason: str, message: str) -> dict[str, Any]:
    condition = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-22T10:02:00Z",
    }
    return {"status": {"rayClusterStatus": {"conditions": [condition]}}}


def test_pods_on_their_way_are_not_stuck() -> None:
    starting = [pod("w-0"), pod("w-1", waiting={"reason": "ContainerCreating"}), pod("h", role="head")]
    assert classify(starting, None, "ml") is None
    assert classify([], {"status": {}}, "ml") is None


def test_a_missing_secret_names_it_and_stalls_at_once() -> None:
    missing = {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}
    stuck = classify([pod("w-0"), pod("w-1", waiting=missing, init=True)], None, "ml")
    assert stuck is not None and stuck.reason == "CreateContainerConfigError" and stuck.stalls_at_once
    assert stuck.message == (
        "pod w-1 cannot start container 'ray-worker': secret \"hf-token\" not found. Create what it names "
        "in namespace ml; the pod starts when it exists."
    )
    assert stuck.since == T0


def test_an_image_that_cannot_be_pulled_names_the_image_and_the_error() -> None:
    back_off = {
        "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "rljob/runtime:1.0": ErrImagePull: manifest unknown',
    }
    stuck = classify([pod("w-0", waiting=back_off)], None, "ml")
    assert stuck is not None and (stuck.reason, stuck.stalls_at_once) == ("ImagePullBackOff", False)
    assert "pod w-0 cannot pull image 'rljob/runtime:1.0' for container 'ray-worker'" in stuck.message
    assert "manifest unknown" in stuck.message and "spec.resources.imagePullSecrets" in stuck.message
    invalid = classify([pod("w-0", waiting={"reason": "InvalidImageName", "message": "bad"})], None, "ml")
    assert invalid is not None and invalid.stalls_at_once  # no retry can pull a malformed name


def test_unschedulable_quotes_the_scheduler_and_what_the_pod_requests() -> None:
    said = "0/8 nodes are available: 4 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector."
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": said,
        "lastTransitionTime": "2026-11-22T10:01:00Z",
    }
    stuck = classify(
        [pod("w-0", waiting={"reason": "ContainerCreating"}, conditions=[unschedulable])], None, "ml"
    )
    assert stuck is not None and stuck.reason == "Unschedulable"
    assert (
        "pod w-0 cannot be scheduled: 0/8 nodes are available: 4 Insufficient nvidia.com/gpu" in stuck.message
    )
    assert "It requests cpu=4, nvidia.com/gpu=8" in stuck.message
    assert stuck.since == T0 + timedelta(minutes=1)  # since the scheduler gave up, not pod creation


def test_a_crash_looping_head_says_how_often_and_how_it_ended() -> None:
    crashing = pod(
        "job-a-head-x",
        role="head",
        waiting={"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"},
        restartCount=7,
        lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137}},
    )
    stuck = classify([crashing], None, "ml")
    assert stuck is not None and stuck.reason == "CrashLoopBackOff"
    assert stuck.message.startswith(
        "the Ray head (pod job-a-head-x) keeps crashing: container 'ray-worker' restarted 7 times, last "
        "ended with OOMKilled, exit code 137 (out of memory: give it more memory)."
    )
    assert "kubectl logs --previous -n ml job-a-head-x -c ray-worker" in stuck.message


def test_pod_creation_refused_by_a_quota_is_read_from_kuberays_replica_failure_condition() -> None:
    # KubeRay v1.6.1: errors.Join(ErrFailedCreateWorkerPod, err).Error(), copied into the RayJob.
    refused = (
        'FailedCreateWorkerPod\npods "job-a-raycluster-x-gpu-worker-abc" is forbidden: exceeded quota: '
        "compute, requested: cpu=4, used: cpu=2, limited: cpu=4"
    )
    stuck = classify(
        [pod("h", role="head")], rayjob_with_replica_failure("FailedCreateWorkerPod", refused), "ml"
    )
    assert stuck is not None and (stuck.reason, stuck.stalls_at_once) == ("QuotaExceeded", False)
    assert stuck.message.startswith(
        'KubeRay cannot create the job\'s worker pods: pods "job-a-raycluster-x-gpu-worker-abc" is '
        "forbidden: exceeded quota: compute, requested: cpu=4, used: cpu=2, limited: cpu=4. "
        "ResourceQuota 'compute' refuses them"
    )
    assert stuck.since == T0 + timedelta(minutes=2)
    policy = 'FailedCreateHeadPod\npods "h" is forbidden: violates PodSecurity "restricted:latest"'
    other = classify([], rayjob_with_replica_failure("FailedCreateHeadPod", policy), "ml")
    assert other is not None and (other.reason, other.stalls_at_once) == ("PodCreationRefused", True)
    assert (
        'KubeRay cannot create the job\'s head pod: pods "h" is forbidden: violates PodSecurity'
        in other.message
    )
    cleared = rayjob_with_replica_failure("FailedCreateWorkerPod", refused)
    cleared["status"]["rayClusterStatus"]["conditions"][0]["status"] = "False"
    assert classify([], cleared, "ml") is None


def test_the_most_actionable_problem_wins_and_the_others_are_counted() -> None:
    back_off = {"reason": "ImagePullBackOff", "message": "x"}
    missing = {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}
    pods = [pod("w-2", waiting=back_off), pod("w-1", waiting=back_off), pod("w-3", waiting=missing)]
    stuck = classify(pods, None, "ml")
    assert stuck is not None and stuck.reason == "CreateContainerConfigError"
    pulling = classify(pods[:2], None, "ml")
    assert pulling is not None and pulling.message.startswith("pod w-1 cannot pull")
    assert pulling.message.endswith("(1 other pod of the job: the same)")
    leaving = pod("w-9", waiting=missing)
    leaving["metadata"]["deletionTimestamp"] = CREATED
    assert classify([leaving], None, "ml") is None  # being deleted: its replacement is what counts
    assert len(set(REASONS)) == len(REASONS)


def test_overdue_counts_from_since() -> None:
    stuck = Stuck("Unschedulable", "m", T0)
    assert not stuck.overdue(T0 + timedelta(seconds=599), 600)
    assert stuck.overdue(T0 + timedelta(seconds=600), 600)
    assert not Stuck("Unschedulable", "m", None).overdue(T0 + timedelta(days=1), 600)


def test_a_refused_volume_is_named_by_the_job_field_it_comes_from() -> None:
    from rljob_api.resource import parse_spec
    from rljob_operator.pod_fields import volume_fields

    from spec_cases import BASE_SPEC, patched

    volumes = [
        {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "nvme", "mountPath": "/nvme", "hostPath": {"path": "/mnt/nvme"}},
    ]
    fields = volume_fields(parse_spec(patched({"resources": {"volumes": volumes}}, BASE_SPEC)))
    # The API server's words (PodSecurity, restricted), as KubeRay copies them into the RayJob.
    policy = (
        'FailedCreateHeadPod\npods "job-a-raycluster-x-head-y" is forbidden: violates PodSecurity '
        '"restricted:latest": restricted volume types (volume "nvme" uses restricted volume type '
        '"hostPath"), hostPath volumes (volume "nvme")'
    )
    stuck = classify([], rayjob_with_replica_failure("FailedCreateHeadPod", policy), "ml", fields)
    assert stuck is not None and stuck.reason == "PodCreationRefused"
    assert stuck.message.endswith(
        "It comes from spec.resources.volumes[1] (nvme) of this job: change it, or ask an administrator "
        "to allow it in this namespace."
    )
    two = policy.replace('(volume "nvme")', '(volumes "nvme", "checkpoints")')
    stuck = classify([], rayjob_with_replica_failure("FailedCreateHeadPod", two), "ml", fields)
    assert stuck is not None and "spec.resources.volumes[1] (nvme) and spec.checkpoint.path" in stuck.message
    # A refusal that names no volume of the job keeps the general advice.
    other = 'FailedCreateHeadPod\npods "h" is forbidden: violates PodSecurity "restricted:latest"'
    stuck = classify([], rayjob_with_replica_failure("FailedCreateHeadPod", other), "ml", fields)
    assert stuck is not None and stuck.message.endswith("(the job's resources, or the namespace's policy).")


# ---- a running job's pods on a node that is not Ready -------------------------------------------


def node(name: str, ready: str | None, reason: str = "", message: str = "") -> dict[str, Any]:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append(
            {
                "type": "Ready",
                "status": ready,
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-11-22T10:03:04Z",
            }
        )
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def on(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    return {**p, "spec": {**p["spec"], "nodeName": node_name}}


def test_only_nodes_whose_ready_condition_is_not_true_are_down() -> None:
    down = not_ready(
        [
            node("ok", "True"),
            node("registering", None),
            node("gone", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."),
            node("sick", "False", "KubeletNotReady", "container runtime network not ready"),
        ]
    )
    assert sorted(down) == ["gone", "sick"]
    assert down["gone"] == NodeDown(
        T0 + timedelta(minutes=3, seconds=4), "NodeStatusUnknown", "Kubelet stopped posting node status"
    )


def test_the_head_on_a_down_node_is_named_first_and_pods_on_their_way_out_are_not() -> None:
    down = not_ready([node("n1", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")])
    leaving = on(pod("w-0"), "n1")
    leaving["metadata"] = {**leaving["metadata"], "deletionTimestamp": "2026-11-22T10:04:00Z"}
    pods = [on(pod("w-1"), "n1"), on(pod("h", role="head"), "n1"), leaving, on(pod("w-2"), "n2")]
    stuck = node_trouble(pods, down, "ml")
    assert stuck is not None and stuck.reason == NODE_NOT_READY and stuck.since == down["n1"].since
    assert stuck.message.startswith(
        "the Ray head (pod h) is on node n1, which is not Ready since 10:03:04 (NodeStatusUnknown: Kubelet "
        "stopped posting node status) (1 other pod of the job on not-Ready nodes). "
    ), stuck.message
    assert node_trouble([on(pod("w-2"), "n2"), pod("unscheduled")], down, "ml") is None
