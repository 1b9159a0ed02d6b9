"""Stuck jobs say why, on the real API server: the real scheduler's refusals, a real ResourceQuota
refusing KubeRay's pod creation, pod states a kubelet reports, and the CRD refusing a name too long
for the RayJob.

kwok (with --manage-all-nodes, as tools/devcluster starts it) runs every pod that gets a node at
once and never rewrites a status it did not write: a test plays the kubelet by writing a pod's
container state (ImagePullBackOff, CrashLoopBackOff), keeping the phase Running so that kwok's
pod-ready stage (which selects Pending pods) leaves it alone. To keep the Ray cluster from becoming
ready (KubeRay would start the Ray job and the job would be Running) one of its pods is kept
unschedulable by the real scheduler. Each test gets a node of its own (8 GPUs, 64 CPUs), so other
jobs on the cluster do not change what fits.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_process import OperatorProcess
from test_operator import condition, status, table, wait_for
from test_operator import job as job_manifest

pytestmark = pytest.mark.e2e

STARTUP_TIMEOUT = 30  # the smallest faultTolerance.startupTimeoutSeconds allowed


@pytest.fixture(scope="module")
def operator(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def own_node(crd: Any) -> Iterator[str]:
    """A kwok node with 8 GPUs and 64 CPUs that only this test's pods select."""
    name = f"stuck-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kwok"}
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    crd.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "rljob.dev/gpu-pool": name, "type": "kwok"},
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{**ready, "lastHeartbeatTime": now, "lastTransitionTime": now}],
            },
        }
    )
    yield name
    crd.kubectl("delete", "node", name, "--wait=false", check=False)


def stuck_job(namespace: str, name: str, node: str, patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job whose pods all select `node`, with the shortest startup timeout; `patch` merges into it."""
    spec: dict[str, Any] = {
        "resources": {"nodeSelector": {"rljob.dev/gpu-pool": node}},
        "faultTolerance": {"startupTimeoutSeconds": STARTUP_TIMEOUT},
    }
    for key, value in (patch or {}).items():
        spec[key] = {**spec.get(key, {}), **value}
    obj = job_manifest(name, spec)
    obj["metadata"]["namespace"] = namespace
    return obj


def ready_reason(crd: Any, namespace: str, name: str, reason: str) -> Any:
    def check() -> dict[str, Any] | None:
        st = status(crd, namespace, name)
        return st if condition(st, "Ready").get("reason") == reason else None

    return check


def pod_of(crd: Any, namespace: str, job: str, role: str) -> Any:
    """The job's pod of `role` once it runs (kwok)."""

    def check() -> dict[str, Any] | None:
        pods = crd.list("pods", namespace, f"rljob.dev/job={job},rljob.dev/role={role}")
        return pods[0] if pods and (pods[0].get("status") or {}).get("phase") == "Running" else None

    return check


def play_kubelet(
    crd: Any, namespace: str, pod: str, container: str, state: dict[str, Any], **extra: Any
) -> None:
    """Write the pod's status as the kubelet would: the container waiting, the pod not ready (the
    phase stays Running: kwok's pod-ready stage would rewrite a Pending pod)."""
    body = {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": container,
                    "image": "rayproject/ray:2.60.0",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": state,
                    **extra,
                }
            ],
        }
    }
    crd.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(body)
    )


def warning_events(crd: Any, namespace: str, job: str) -> list[dict[str, Any]]:
    events = crd.list("events", namespace)
    return [e for e in events if e["involvedObject"]["name"] == job and e["type"] == "Warning"]


def test_a_name_longer_than_the_rayjob_allows_is_refused_at_admission(crd: Any, namespace: str) -> None:
    obj = job_manifest("a" * 48)
    obj["metadata"]["namespace"] = namespace
    proc = crd.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert proc.returncode != 0
    assert (
        "metadata.name: Invalid value: the name has more than 47 characters; KubeRay allows at most 47 for "
        "the RayJob it runs on. Create the job again with a shorter name." in proc.stderr
    )
    crd.apply({**obj, "metadata": {**obj["metadata"], "name": "a" * 47}})  # 47 is fine


def test_an_image_pull_failure_shows_within_a_resync_and_stalls_after_the_timeout(
    crd: Any, operator: OperatorProcess, namespace: str, own_node: str
) -> None:
    # The head asks for more CPUs than the node has: the real scheduler refuses it, so the Ray
    # cluster cannot become ready while the worker runs (kwok) and the test plays its kubelet.
    crd.apply(stuck_job(namespace, "pulling", own_node, {"resources": {"head": {"cpu": "100"}}}))
    st = wait_for("Unschedulable head", ready_reason(crd, namespace, "pulling", "Unschedulable"), operator)
    message = condition(st, "Ready")["message"]
    assert "the Ray head (pod pulling-" in message and "Insufficient cpu" in message  # the scheduler's words
    worker = wait_for("worker pod running", pod_of(crd, namespace, "pulling", "gpu"), operator)
    back_off = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "rayproject/ray:2.60.0"'}
    play_kubelet(crd, namespace, worker["metadata"]["name"], "ray-worker", {"waiting": back_off})
    st = wait_for(
        "ImagePullBackOff", ready_reason(crd, namespace, "pulling", "ImagePullBackOff"), operator, timeout=20
    )
    assert st["phase"] == "Starting" and condition(st, "Stalled")["status"] == "False"
    message = condition(st, "Ready")["message"]
    assert f"pod {worker['metadata']['name']} cannot pull image 'rayproject/ray:2.60.0'" in message
    (row,) = table(crd.kubectl("get", "rljobs", "-n", namespace, "-o", "wide").stdout)
    assert row["MESSAGE"] == message  # the -o wide column
    (row,) = table(crd.kubectl("get", "rljobs", "-n", namespace).stdout)
    assert (row["PHASE"], row["REASON"]) == ("Starting", "ImagePullBackOff")  # stuck, in the default columns
    assert any(e["reason"] == "ImagePullBackOff" for e in warning_events(crd, namespace, "pulling"))

    def stalled() -> dict[str, Any] | None:
        current = status(crd, namespace, "pulling")
        return current if condition(current, "Stalled").get("status") == "True" else None

    st = wait_for("Stalled after the startup timeout", stalled, operator, timeout=STARTUP_TIMEOUT + 30)
    assert condition(st, "Stalled")["reason"] == "ImagePullBackOff" and st["phase"] == "Starting"
    assert "Stuck for over 30 s (faultTolerance.startupTimeoutSeconds)" in condition(st, "Stalled")["message"]
    assert condition(st, "Reconciling")["status"] == "False"


def test_a_crash_looping_head_behind_a_full_node_fails_the_job_when_asked(
    crd: Any, operator: OperatorProcess, namespace: str, own_node: str
) -> None:
    hog = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-hog", "namespace": namespace},
        "spec": {
            "nodeSelector": {"rljob.dev/gpu-pool": own_node},
            "containers": [
                {"name": "hog", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
        },
    }
    crd.apply(hog)
    wait_for(
        "the hog scheduled",
        lambda: ((crd.get("pod", "gpu-hog", namespace) or {}).get("spec") or {}).get("nodeName"),
        operator,
    )
    crd.apply(stuck_job(namespace, "crowded", own_node, {"faultTolerance": {"onStartupTimeout": "Fail"}}))
    st = wait_for(
        "Unschedulable", ready_reason(crd, namespace, "crowded", "Unschedulable"), operator, timeout=30
    )
    message = condition(st, "Ready")["message"]
    assert (
        "cannot be scheduled: 0/" in message and "Insufficient nvidia.com/gpu" in message
    )  # the scheduler's
    assert "It requests " in message and "nvidia.com/gpu=8" in message
    head = wait_for("head pod running", pod_of(crd, namespace, "crowded", "head"), operator)
    play_kubelet(
        crd,
        namespace,
        head["metadata"]["name"],
        "ray-head",
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        restartCount=3,
        lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137}},
    )
    st = wait_for(
        "CrashLoopBackOff", ready_reason(crd, namespace, "crowded", "CrashLoopBackOff"), operator, timeout=20
    )
    message = condition(st, "Ready")["message"]
    assert f"the Ray head (pod {head['metadata']['name']}) keeps crashing" in message
    assert "restarted 3 times, last ended with OOMKilled, exit code 137" in message

    def failed() -> dict[str, Any] | None:
        current = status(crd, namespace, "crowded")
        return current if current.get("phase") == "Failed" else None

    st = wait_for("Failed after the startup timeout", failed, operator, timeout=STARTUP_TIMEOUT + 30)
    assert condition(st, "Failed")["reason"] == "CrashLoopBackOff"
    # The status is written first, the RayJob suspended in the same pass just after (reconcile.py).
    wait_for(
        "the RayJob suspended",
        lambda: (crd.get("rayjob", "crowded", namespace)["spec"].get("suspend") is True) or None,
        operator,
        timeout=10,
    )
    wait_for(
        "the job's pods deleted (their quota freed)",
        lambda: crd.list("pods", namespace, "rljob.dev/job=crowded") == [] or None,
        operator,
        timeout=60,
    )
    time.sleep(6)  # a resync later it is still Failed and nothing came back
    assert status(crd, namespace, "crowded")["phase"] == "Failed"
    assert crd.list("pods", namespace, "rljob.dev/job=crowded") == []


def test_a_quota_refusing_kuberays_pods_is_named(
    crd: Any, operator: OperatorProcess, namespace: str, own_node: str
) -> None:
    crd.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "two-pods", "namespace": namespace},
            "spec": {"hard": {"pods": "1"}},
        }
    )
    wait_for(
        "the quota counted",
        lambda: ((crd.get("resourcequota", "two-pods", namespace) or {}).get("status") or {}).get("used"),
        operator,
    )
    crd.apply(stuck_job(namespace, "over-quota", own_node))
    st = wait_for(
        "QuotaExceeded", ready_reason(crd, namespace, "over-quota", "QuotaExceeded"), operator, timeout=60
    )
    message = condition(st, "Ready")["message"]
    assert "KubeRay cannot create the job's worker pods" in message
    assert "exceeded quota: two-pods" in message and "ResourceQuota 'two-pods' refuses them" in message
    assert any(e["reason"] == "QuotaExceeded" for e in warning_events(crd, namespace, "over-quota"))


def test_a_failed_jobs_column_shows_the_runtimes_last_line(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    crash = 'python -c \'import sys; print("loading"); print("rljob: reward function crashed"); sys.exit(3)\''
    obj = job_manifest("bad", {}, entrypoint=crash)
    obj["metadata"]["namespace"] = namespace
    crd.apply(obj)
    st = wait_for(
        "Failed",
        lambda: (
            status(crd, namespace, "bad") if status(crd, namespace, "bad").get("phase") == "Failed" else None
        ),
        operator,
        timeout=180,
    )
    assert condition(st, "Ready")["message"] == "rljob: reward function crashed"
    (row,) = table(crd.kubectl("get", "rljobs", "-n", namespace, "-o", "wide").stdout)
    assert row["MESSAGE"] == "rljob: reward function crashed"
    failed = condition(st, "Failed")["message"]
    assert failed.startswith("rljob: reward function crashed (RayJob bad)") and "loading" in failed
