"""A job's pods fail on the real node the way they fail on a cluster, and the operator (a pod itself)
says why in the job's status and events: an image that cannot be pulled (every pull goes to a
closed local port), a container that exits non-zero at start, a container killed for memory (its
limit below what `ray start` needs). KubeRay creates the pods; the kubelet, containerd, runc and
the kernel produce the failures."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.conftest import Cluster
from real_pods import wait_for

pytestmark = pytest.mark.realpods

REPO = Path(__file__).resolve().parents[2]
RESYNC_S = 10  # the operator_release's operator.resyncSeconds
RUNTIME = "docker.io/rljob/runtime-cpu:0.1.0"


def small_job(namespace: str, name: str, image: str, memory: str = "512Mi") -> dict[str, Any]:
    """The CPU demo's job, sized to fit the real node beside the operator, running `image`."""
    job = yaml.safe_load((REPO / "examples" / "manifests" / "grpo-cpu-demo.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": namespace}
    res = job["spec"]["resources"]
    res["image"] = image
    res["head"] = {"cpu": "250m", "memory": memory}
    res["trainer"].update(cpu="250m", memory=memory)
    return job


def ready_condition(cluster: Cluster, name: str, ns: str) -> dict[str, Any]:
    job = cluster.get("rljob", name, ns) or {}
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})


def head_pod(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    pods = cluster.list("pods", ns, "ray.io/node-type=head")
    return pods[0] if pods else None


def waiting_reason(pod: dict[str, Any] | None) -> str:
    """Why a container (or an init container: KubeRay's workers wait for the head in one) waits."""
    status_of = (pod or {}).get("status", {})
    for status in [*status_of.get("initContainerStatuses", []), *status_of.get("containerStatuses", [])]:
        waiting = status.get("state", {}).get("waiting")
        if waiting:
            return str(waiting.get("reason", ""))
    return ""


@pytest.mark.parametrize(
    ("image", "kubelet_reasons", "status_reason", "words"),
    [
        # Not loaded into the node, and no registry to pull from.
        (
            "docker.io/rljob/no-such-image:0.1.0",
            {"ErrImagePull", "ImagePullBackOff"},
            {"ErrImagePull", "ImagePullBackOff"},
            ["no-such-image"],
        ),
        # An image without Ray: KubeRay's `ray start` is not found, the container exits 127.
        (
            "docker.io/rljob/operator:0.1.0",
            {"CrashLoopBackOff"},
            {"CrashLoopBackOff"},
            ["exit code 127"],
        ),
        # The runtime's image with 64 MiB: `ray start` (Python, Ray's modules) outgrows the limit and
        # the kernel kills it (OOMKilled, exit code 137).
        (
            RUNTIME,
            {"CrashLoopBackOff"},
            {"CrashLoopBackOff"},
            ["OOMKilled", "exit code 137", "out of memory"],
        ),
    ],
    ids=["image-not-pullable", "exits-at-start", "oom-killed"],
)
def test_a_failing_pod_shows_in_status_and_events(
    real_cluster: Cluster,
    job_namespace: str,
    image: str,
    kubelet_reasons: set[str],
    status_reason: set[str],
    words: list[str],
    request: pytest.FixtureRequest,
) -> None:
    ns, name = job_namespace, "faulty"
    if image == RUNTIME:
        request.getfixturevalue("runtime_image")  # the runtime image in the node's containerd
    real_cluster.apply(small_job(ns, name, image, memory="64Mi" if image == RUNTIME else "512Mi"))
    pod = wait_for(
        "the head pod on the real node, failing as the kubelet reports it",
        lambda: (p := head_pod(real_cluster, ns)) and waiting_reason(p) in kubelet_reasons and p,
        240,
    )
    assert pod["spec"]["nodeName"] == "real-0"
    seen_at = time.monotonic()
    pod_name = pod["metadata"]["name"]
    ready = wait_for(
        "the operator's status naming the pod and the cause",
        lambda: (c := ready_condition(real_cluster, name, ns)).get("reason") in status_reason and c,
        RESYNC_S + 30,
    )
    took = time.monotonic() - seen_at
    # It names one of the job's failing pods (the head's or a worker's: they fail alike).
    failing = {
        p["metadata"]["name"]
        for p in real_cluster.list("pods", ns, "")
        if waiting_reason(p) in kubelet_reasons
    }
    named = [name for name in failing | {pod_name} if name in ready["message"]]
    assert named, (ready, failing)
    pod_name = named[0]
    for word in words:
        assert word in ready["message"], ready
    assert took <= RESYNC_S + 30, f"status {took:.0f} s after the kubelet's report"
    wide = real_cluster.kubectl("get", "rljob", name, "-n", ns, "-o", "wide").stdout
    pods = failing | {pod_name}
    # The MESSAGE column. Which pod it names may change: the kubelet alternates ErrImagePull and
    # ImagePullBackOff, and the operator names the pod with the most actionable reason of the moment.
    assert any(n in wide for n in pods), wide
    events = [
        e
        for e in real_cluster.list("events", ns, "")
        if e["involvedObject"].get("kind") == "RLTrainingJob" and e["involvedObject"]["name"] == name
    ]
    # The operator's identity has no `bind`: its RoleBinding must wait for its Role (a RoleBinding
    # sent beside it was refused with a 404, seen here before the fix).
    assert not [e["message"] for e in events if e["reason"] == "ApplyRefused"]
    assert any(e["reason"] in status_reason and any(n in e["message"] for n in pods) for e in events), [
        (e["reason"], e["message"]) for e in events
    ]
