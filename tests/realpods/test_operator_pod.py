"""The operator as a pod: installed by helm from charts/rljob with the image `make images` built, in
a namespace that enforces `restricted`, on a read-only root filesystem, talking to the API server
with its ServiceAccount's token; its probes pass and its metrics are scraped from another pod."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.conftest import Cluster
from real_pods import RELEASE, pod, wait_for, wait_phase

pytestmark = pytest.mark.realpods

REPO = Path(__file__).resolve().parents[2]


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def test_operator_pod_serves_probes_metrics_and_writes_status(
    real_cluster: Cluster, operator_release: str
) -> None:
    ns = operator_release
    (op,) = real_cluster.list("pods", ns, "app.kubernetes.io/name=rljob-operator")
    assert op["spec"]["nodeName"] == "real-0"
    (container,) = op["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Liveness (kopf's /healthz, every 20 s after 10 s) and readiness (/metrics) over a while.
    time.sleep(35)
    (op,) = real_cluster.list("pods", ns, "app.kubernetes.io/name=rljob-operator")
    (status,) = op["status"]["containerStatuses"]
    assert status["ready"] is True and status["restartCount"] == 0, status
    # Readiness may fail while the operator starts (its /metrics comes up with it); never after the
    # pod was Ready, and liveness never.
    ready_at = next(c["lastTransitionTime"] for c in op["status"]["conditions"] if c["type"] == "Ready")
    unhealthy = [
        (e["message"], e["lastTimestamp"])
        for e in real_cluster.list("events", ns, "")
        if e.get("reason") == "Unhealthy"
        and (e["message"].startswith("Liveness") or e["lastTimestamp"] > ready_at)
    ]
    assert not unhealthy, f"probe failures (pod Ready at {ready_at}): {unhealthy}"

    # Metrics, scraped from another pod through the Service's cluster DNS name.
    scrape = pod(
        "scrape",
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://{RELEASE}-metrics.{ns}.svc.cluster.local:8080/metrics', timeout=10)"
        ".read().decode())",
    )
    scrape["metadata"]["namespace"] = ns
    real_cluster.apply(scrape)
    done = wait_phase(real_cluster, ns, "scrape", {"Succeeded", "Failed"}, timeout=120)
    metrics = real_cluster.kubectl("logs", "-n", ns, "scrape").stdout
    assert done["status"]["phase"] == "Succeeded", metrics
    assert "rljob_" in metrics and "python_info" in metrics

    # The operator reconciles from inside the pod, with its ServiceAccount: a job whose checkpoint
    # claim does not exist gets a status that names it, written by the operator's field manager.
    jobs = f"jobs-{uuid.uuid4().hex[:6]}"
    real_cluster.kubectl("create", "namespace", jobs)
    try:
        job = yaml.safe_load((REPO / "examples" / "manifests" / "grpo-cpu-demo.yaml").read_text())
        job["metadata"]["namespace"] = jobs
        job["spec"]["checkpoint"]["volume"] = {"claimName": "no-such-claim"}
        real_cluster.apply(job)
        name = job["metadata"]["name"]
        stalled = wait_for(
            "the job's status from the operator pod",
            lambda: condition(real_cluster.get("rljob", name, jobs), "Stalled"),
            90,
        )
        assert stalled["status"] == "True" and "no-such-claim" in stalled["message"], stalled
        shown = real_cluster.kubectl("get", "rljob", name, "-n", jobs, "-o", "json", "--show-managed-fields")
        obj = json.loads(shown.stdout)
        managers = {
            m["manager"] for m in obj["metadata"]["managedFields"] if m.get("subresource") == "status"
        }
        assert "rljob-operator" in managers, json.dumps(obj["metadata"]["managedFields"])[:500]
        assert not real_cluster.list("rayjobs", jobs, ""), "a job missing its claim must not start"
    finally:
        real_cluster.kubectl("delete", "namespace", jobs, "--wait=false", check=False)
