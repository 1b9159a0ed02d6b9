"""KubeRay on the local control plane: RayJobs really run on the local Ray; GPU pods really get scheduled.

Only pods are simulated (kwok); the API server, scheduler, controller-manager and KubeRay are real,
and a RayJob's entrypoint runs on the real local Ray head that devcluster.py started.
"""

from __future__ import annotations

import json
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.e2e

RAY_IMAGE = "rayproject/ray:2.60.0"  # never pulled: kwok runs no containers
JOB_TIMEOUT_S = 240
H100_NODES = {f"gpu-h100-{i}" for i in range(4)}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def head_group() -> dict[str, Any]:
    return {
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-head",
                        "image": RAY_IMAGE,
                        "resources": {
                            "requests": {"cpu": "1", "memory": "2Gi"},
                            "limits": {"cpu": "1", "memory": "2Gi"},
                        },
                    }
                ]
            }
        },
    }


def rayjob(name: str, namespace: str, entrypoint: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "entrypoint": entrypoint,
            "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {"headGroupSpec": head_group()},
        },
    }


def wait_rayjob_finished(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        obj = cluster.get("rayjob", name, namespace)
        status = (obj or {}).get("status", {})
        if status.get("jobDeploymentStatus") in ("Complete", "Failed", "ValidationFailed"):
            return status
        time.sleep(2)
    pytest.fail(
        f"RayJob {namespace}/{name} did not finish in {JOB_TIMEOUT_S} s; last status {json.dumps(status)}; "
        + cluster.logs_hint(),
        pytrace=False,
    )


def ray_job_info(cluster: Cluster, job_id: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{cluster.ray_dashboard}/api/jobs/{job_id}", timeout=10) as resp:
        return json.loads(resp.read())


def wait_gone(cluster: Cluster, kind: str, name: str, namespace: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.get(kind, name, namespace) is None:
            return
        time.sleep(2)
    pytest.fail(f"{kind} {namespace}/{name} still exists after {timeout:.0f} s", pytrace=False)


def test_rayjob_entrypoint_runs_on_local_ray(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    name = unique("rj-ok")
    out = tmp_path / "out.txt"
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import pathlib, sys
            import ray
            ray.init()  # connects to the Ray cluster the job was submitted to
            n = ray.get(ray.remote(lambda x: x * 2).remote(21))
            pathlib.Path(sys.argv[1]).write_text(f"hello from {sys.argv[2]}: {n}")
            """
        )
    )
    cluster.apply(rayjob(name, namespace, f"python {script} {out} {name}"))

    status = wait_rayjob_finished(cluster, name, namespace)

    assert status.get("jobStatus") == "SUCCEEDED", status
    assert status.get("jobDeploymentStatus") == "Complete", status
    assert out.read_text() == f"hello from {name}: 42"
    # The job KubeRay submitted is the one the local Ray ran.
    info = ray_job_info(cluster, status["jobId"])
    assert info["status"] == "SUCCEEDED", info
    assert info["entrypoint"] == f"python {script} {out} {name}"
    assert status["dashboardURL"].endswith(f".{namespace}.svc.cluster.local:8265"), status
    # shutdownAfterJobFinishes: KubeRay deletes the RayCluster it created.
    wait_gone(cluster, "raycluster", status["rayClusterName"], namespace)


def test_rayjob_nonzero_exit_fails(cluster: Cluster, namespace: str) -> None:
    name = unique("rj-fail")
    cluster.apply(rayjob(name, namespace, "python -c 'import sys; sys.exit(3)'"))

    status = wait_rayjob_finished(cluster, name, namespace)

    assert status.get("jobStatus") == "FAILED", status
    assert status.get("jobDeploymentStatus") == "Failed", status
    info = ray_job_info(cluster, status["jobId"])
    assert info["status"] == "FAILED", info


def gpu_raycluster(name: str, namespace: str, gpus_per_worker: int, replicas: int) -> dict[str, Any]:
    worker = {
        "name": "ray-worker",
        "image": RAY_IMAGE,
        "resources": {
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(gpus_per_worker)},
            "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(gpus_per_worker)},
        },
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "headGroupSpec": head_group(),
            "workerGroupSpecs": [
                {
                    "groupName": "h100",
                    "replicas": replicas,
                    "minReplicas": replicas,
                    "maxReplicas": replicas,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "nodeSelector": {"rljob.dev/gpu-pool": "h100"},
                            "tolerations": [
                                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                            ],
                            "containers": [worker],
                        }
                    },
                }
            ],
        },
    }


def wait_pods(
    cluster: Cluster, namespace: str, selector: str, count: int, done: Any, timeout: float = 90
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    pods: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = cluster.list("pods", namespace, selector)
        if len(pods) == count and all(done(p) for p in pods):
            return pods
        time.sleep(1)
    summary = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"]) for p in pods]
    pytest.fail(
        f"pods {selector} in {namespace} not as expected after {timeout:.0f} s: {summary}", pytrace=False
    )


def test_gpu_workers_scheduled_on_h100_nodes(cluster: Cluster, namespace: str) -> None:
    name = unique("rc-gpu")
    cluster.apply(gpu_raycluster(name, namespace, gpus_per_worker=8, replicas=2))

    workers = wait_pods(
        cluster,
        namespace,
        f"ray.io/cluster={name},ray.io/node-type=worker",
        2,
        lambda p: p["spec"].get("nodeName") and p["status"].get("phase") == "Running",
    )
    nodes = [p["spec"]["nodeName"] for p in workers]
    assert set(nodes) <= H100_NODES, nodes
    assert len(set(nodes)) == 2, f"8 GPUs each must land on two different 8-GPU nodes: {nodes}"
    head = wait_pods(
        cluster,
        namespace,
        f"ray.io/cluster={name},ray.io/node-type=head",
        1,
        lambda p: p["spec"].get("nodeName"),
    )[0]
    assert head["spec"]["nodeName"].startswith("cpu-"), "the head has no toleration: it must avoid GPU nodes"

    cluster.kubectl("delete", "raycluster", name, f"--namespace={namespace}", "--wait=true", "--timeout=60s")
    wait_pods(cluster, namespace, f"ray.io/cluster={name}", 0, lambda p: True, timeout=60)


def test_impossible_gpu_request_stays_pending(cluster: Cluster, namespace: str) -> None:
    name = unique("rc-big")
    cluster.apply(gpu_raycluster(name, namespace, gpus_per_worker=16, replicas=1))

    def unschedulable(p: dict[str, Any]) -> bool:
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        sched = conds.get("PodScheduled", {})
        return sched.get("status") == "False" and sched.get("reason") == "Unschedulable"

    pod = wait_pods(cluster, namespace, f"ray.io/cluster={name},ray.io/node-type=worker", 1, unschedulable)[0]
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    message = {c["type"]: c for c in pod["status"]["conditions"]}["PodScheduled"].get("message", "")
    assert "nvidia.com/gpu" in message, message
