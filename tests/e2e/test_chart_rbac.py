"""No dead permission in the chart: taking away any one verb of the operator's role breaks a named
part of the operator, and the operator says which verb on which resource it was denied.

Each case runs the operator with a ServiceAccount bound to the chart's rules minus one verb and a
job that exercises every path (quota, checkpoint claim, runtime identity, events), then waits
for the API server's refusal of exactly that verb in the operator's log.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chart_install import token_kubeconfig
from chart_render import render
from operator_process import OperatorProcess
from test_operator import _in, job

pytestmark = pytest.mark.e2e


def _chart_rules() -> list[dict[str, Any]]:
    (role,) = [d for d in render() if d["kind"] == "ClusterRole"]
    return role["rules"]


def _cases() -> list[tuple[int, str, str]]:
    return [
        (i, resource, verb)
        for i, rule in enumerate(_chart_rules())
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


# What the API server says when a verb is missing, where it is not "cannot <verb> resource <r>".
SIGNATURES = {
    # The runtime's Role grants get on the job's status: RBAC refuses to let the operator grant it.
    ("rltrainingjobs/status", "get"): "attempting to grant RBAC permissions not currently held",
    # OwnerReferencesPermissionEnforcement (enabled in the dev cluster, as on hardened clusters).
    ("rltrainingjobs/finalizers", "update"): "not allowed to update rltrainingjobs/finalizers.rljob.dev",
}
# The part of the operator each resource serves (what breaks), for the failure message.
PARTS = {
    "rltrainingjobs": "watching and reading jobs",
    "rltrainingjobs/status": "writing status (and granting the runtime its own)",
    "rltrainingjobs/finalizers": "creating children owned by the job",
    "rayjobs": "creating and following the job's RayJob",
    "serviceaccounts": "the runtime's ServiceAccount",
    "roles": "the runtime's Role",
    "rolebindings": "the runtime's RoleBinding",
    "pods": "following the job's pods (quota use, start-up errors)",
    "resourcequotas": "the GPU quota decision",
    "persistentvolumeclaims": "the checkpoint claim pre-flight",
    "events": "events on jobs",
    "nodes": "the GPU node pre-flight",
}


@dataclass
class Probe:
    cluster: Any
    namespace: str
    kubeconfig: Path
    role: str


@pytest.fixture(scope="module")
def probe(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    """A ServiceAccount bound to a ClusterRole that each case rewrites."""
    suffix = uuid.uuid4().hex[:6]
    namespace, role = f"rbac-probe-{suffix}", f"rbac-probe-{suffix}"
    crd.kubectl("create", "namespace", namespace)
    crd.kubectl("create", "serviceaccount", "operator", "-n", namespace)
    crd.apply(
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": namespace}],
        },
    )
    path = tmp_path_factory.mktemp("rbac") / "kubeconfig"
    yield Probe(crd, namespace, token_kubeconfig(crd, "operator", namespace, path), role)
    crd.kubectl("delete", "clusterrolebinding,clusterrole", role, "--wait=false", check=False)
    crd.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _without(rules: list[dict[str, Any]], index: int, resource: str, verb: str) -> list[dict[str, Any]]:
    out = []
    for i, rule in enumerate(rules):
        if i != index:
            out.append(rule)
            continue
        for r in rule["resources"]:  # split the rule so only (resource, verb) goes
            verbs = [v for v in rule["verbs"] if not (r == resource and v == verb)]
            if verbs:
                out.append({**rule, "resources": [r], "verbs": verbs})
    return out


def _workload(namespace: str) -> list[dict[str, Any]]:
    """Jobs that take every path: GPU quota (rayjobs, pods, quotas), a checkpoint claim, a runtime
    identity, phase events, a restart."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": {"requests.nvidia.com/gpu": "16"}},
    }
    spec = {"checkpoint": {"path": "/ckpt", "volume": {"claimName": "ckpt"}}}
    # A Ray job that fails (exit 1: retriable) once: the operator deletes its RayJob to restart it.
    fails = job(
        "fails", {"faultTolerance": {"backoffLimit": 1}}, entrypoint="python -c 'raise SystemExit(1)'"
    )
    return [claim, quota, _in(namespace, job("probe", spec)), _in(namespace, fails)]


@contextlib.contextmanager
def _operator_with(
    probe: Probe, rules: list[dict[str, Any]], log_dir: Path
) -> Iterator[tuple[str, OperatorProcess]]:
    """The probe's role set to `rules`, and an operator with that identity serving a fresh
    namespace in which the workload is applied."""
    probe.cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": probe.role},
            "rules": rules,
        }
    )
    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    probe.cluster.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(
        probe.kubeconfig, log_dir, resync_seconds=2, args=(f"--namespace={namespace}",)
    )
    try:
        time.sleep(1)  # RBAC changes reach the authorizer's cache within a moment
        operator.start()
        probe.cluster.apply(*_workload(namespace))
        yield namespace, operator
    finally:
        operator.stop()
        probe.cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.parametrize(("index", "resource", "verb"), _cases(), ids=[f"{v}-{r}" for _, r, v in _cases()])
def test_each_verb_of_the_chart_role_is_needed(
    probe: Probe, tmp_path: Path, index: int, resource: str, verb: str
) -> None:
    rules = _without(_chart_rules(), index, resource, verb)
    expected = SIGNATURES.get((resource, verb), f'cannot {verb} resource "{resource}"')
    with _operator_with(probe, rules, tmp_path) as (_, operator):
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if expected in operator.log_path.read_text(errors="replace"):
                break
            time.sleep(0.5)
        else:
            pytest.fail(
                f"without {verb} on {resource} ({PARTS[resource]}), the operator never reported "
                f"{expected!r}: is this verb dead?\noperator log:\n{operator.log_tail(40)}",
                pytrace=False,
            )


def test_a_denied_write_is_a_condition_and_an_event_on_the_job(probe: Probe, tmp_path: Path) -> None:
    """Not a silent retry loop: `kubectl describe` shows which verb on which resource was refused."""
    cluster = probe.cluster
    rules = [r for r in _chart_rules() if "rayjobs" not in r["resources"]]
    rules.append({"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch"]})
    with _operator_with(probe, rules, tmp_path) as (namespace, operator):
        deadline, stalled = time.monotonic() + 40, {}
        while time.monotonic() < deadline and stalled.get("reason") != "PermissionDenied":
            obj = cluster.get("rljob", "probe", namespace) or {}
            conditions = (obj.get("status") or {}).get("conditions") or []
            stalled = next((c for c in conditions if c["type"] == "Stalled"), {})
            time.sleep(0.5)
        assert stalled.get("reason") == "PermissionDenied", operator.log_tail(40)
        assert (
            stalled["status"] == "True"
            and f"patch rayjobs.ray.io in namespace {namespace}" in stalled["message"]
        )
        events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
        assert any(e["reason"] == "PermissionDenied" for e in events)
        described = cluster.kubectl("describe", "rljob", "probe", "-n", namespace).stdout
        assert "PermissionDenied" in described
