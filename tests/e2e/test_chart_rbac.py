"""No dead permission in the chart: taking away any one verb of the operator's role breaks a named
part of the operator, and the operator says which verb on which resource it was denied.

Each case runs the operator with a ServiceAccount bound to the chart's rules minus one verb and a
job that exercises every path (quota, checkpoint claim, runtime identity, events), then waits
for the API server's refusal of exactly that verb in the operator's log. The operator runs with
leader election, as the chart runs it: the chart's lease Role is bound in the namespace it serves,
and its verbs are taken away in turn too. The cases run several at a time, each with its own
ServiceAccount, ClusterRole, namespace and operator process: a case mostly waits.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
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
    """The operator's ClusterRole (not the editor and viewer roles, which are people's)."""
    (role,) = [d for d in render() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "rljob"]
    return role["rules"]


LEASE = "rljob-leader"  # the chart's lease for a release named rljob (the Role names it)


def _lease_rules() -> list[dict[str, Any]]:
    """The Role of the operator's leader election, in the release namespace."""
    (role,) = [d for d in render() if d["kind"] == "Role" and d["metadata"]["name"] == LEASE]
    return role["rules"]


def _cases() -> list[tuple[str, int, str, str]]:
    return [
        (role, i, resource, verb)
        for role, rules in (("cluster", _chart_rules()), ("lease", _lease_rules()))
        for i, rule in enumerate(rules)
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
    "events": "events on jobs, and at start the phase changes a previous operator did not announce",
    "leases": "leader election: the replicas' Lease",
    "nodes": "the GPU node pre-flight",
}


@dataclass
class Identity:
    """A ServiceAccount bound to a ClusterRole of its own, and a kubeconfig that acts as it."""

    cluster: Any
    namespace: str
    account: str
    role: str
    kubeconfig: Path

    def set_rules(self, rules: list[dict[str, Any]]) -> None:
        self.cluster.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": self.role},
                "rules": rules,
            }
        )


def _identity(cluster: Any, namespace: str, account: str, role: str, kubeconfig: Path) -> Identity:
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.apply(
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    return Identity(
        cluster, namespace, account, role, token_kubeconfig(cluster, account, namespace, kubeconfig)
    )


@pytest.fixture(scope="module")
def identities(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Identity]]:
    """Makes identities in a namespace of their own; all are removed after the module."""
    suffix = uuid.uuid4().hex[:6]
    namespace, made = f"rbac-probe-{suffix}", []
    crd.kubectl("create", "namespace", namespace)
    folder = tmp_path_factory.mktemp("rbac")

    def make() -> Identity:
        name = f"rbac-probe-{suffix}-{len(made)}"
        made.append(name)
        return _identity(crd, namespace, f"operator-{len(made) - 1}", name, folder / f"{name}.kubeconfig")

    yield make
    for name in made:
        crd.kubectl("delete", "clusterrolebinding,clusterrole", name, "--wait=false", check=False)
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


@dataclass
class Served:
    """An operator acting as an identity, serving a namespace of its own with the workload in it."""

    identity: Identity
    namespace: str
    operator: OperatorProcess

    def stop(self) -> None:
        self.operator.stop()
        self.identity.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


def _serve(
    identity: Identity, rules: list[dict[str, Any]], log_dir: Path, lease_rules: list[dict[str, Any]]
) -> Served:
    """The identity's role set to `rules`, and an operator (launched, not yet healthy) with that
    identity serving a fresh namespace, electing its leader with a lease Role there of `lease_rules`."""
    cluster = identity.cluster
    identity.set_rules(rules)
    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    rbac = "rbac.authorization.k8s.io"
    cluster.apply(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": LEASE, "namespace": namespace},
            "rules": lease_rules,
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": LEASE, "namespace": namespace},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": LEASE},
            "subjects": [
                {"kind": "ServiceAccount", "name": identity.account, "namespace": identity.namespace}
            ],
        },
    )
    elect = ("--leader-elect", f"--leader-election-namespace={namespace}", f"--leader-election-name={LEASE}")
    log_dir.mkdir(parents=True, exist_ok=True)
    operator = OperatorProcess(
        identity.kubeconfig, log_dir, resync_seconds=2, args=(f"--namespace={namespace}", *elect)
    )
    return Served(identity, namespace, operator)


# Cases run this many at a time, each with its own identity, operator and namespace: a case waits
# (for the operator to start, for the refusal to come round) far more than it computes.
AT_ONCE = 8
# The wait ends when every case has its verdict; beside the demo test this stream runs at nice 10.
CASE_TIMEOUT_S = 240.0


@dataclass
class Verdict:
    refused: bool  # the operator logged the API server's refusal of exactly the missing verb
    waited_s: float
    log_tail: str


def _expected(resource: str, verb: str) -> str:
    return SIGNATURES.get((resource, verb), f'cannot {verb} resource "{resource}"')


def _run_batch(
    batch: list[tuple[str, int, str, str]], make: Callable[[], Identity], folder: Path, pool: list[Identity]
) -> dict[tuple[str, int, str, str], Verdict]:
    served: dict[tuple[str, int, str, str], Served] = {}
    try:
        for n, case in enumerate(batch):
            role, index, resource, verb = case
            rules, lease_rules = _chart_rules(), _lease_rules()
            if role == "cluster":
                rules = _without(rules, index, resource, verb)
            else:
                lease_rules = _without(lease_rules, index, resource, verb)
            if n == len(pool):
                pool.append(make())
            served[case] = _serve(
                pool[n], rules, folder / f"{verb}-{resource.replace('/', '-')}", lease_rules
            )
        time.sleep(1)  # RBAC changes reach the authorizer's cache within a moment
        started = time.monotonic()
        for s in served.values():
            s.operator.launch()  # not waited for: some cases end the operator (a lease it cannot renew)
            s.identity.cluster.apply(*_workload(s.namespace))
        verdicts: dict[tuple[str, int, str, str], Verdict] = {}
        while len(verdicts) < len(served) and time.monotonic() - started < CASE_TIMEOUT_S:
            for case, s in served.items():
                if case not in verdicts and s.operator.lost_its_port():
                    s.operator.launch()  # on other ports; its log starts afresh
                elif case not in verdicts and _expected(case[2], case[3]) in s.operator.log_path.read_text(
                    errors="replace"
                ):
                    verdicts[case] = Verdict(True, time.monotonic() - started, "")
            time.sleep(0.5)
        for case, s in served.items():
            verdicts.setdefault(case, Verdict(False, time.monotonic() - started, s.operator.log_tail(40)))
        return verdicts
    finally:
        for s in served.values():
            s.stop()


@pytest.fixture(scope="module")
def verdicts(
    identities: Callable[[], Identity],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> dict[tuple[str, int, str, str], Verdict]:
    """The verdict of every case selected (`-k` included), from operators run AT_ONCE at a time
    (identities reused across batches: each batch rewrites their roles)."""
    selected = [
        item.callspec.params
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_each_verb_of_the_chart_role_is_needed"
    ]
    cases = [(p["role"], p["index"], p["resource"], p["verb"]) for p in selected]
    folder, pool = tmp_path_factory.mktemp("verbs"), []
    found: dict[tuple[str, int, str, str], Verdict] = {}
    for first in range(0, len(cases), AT_ONCE):
        found.update(_run_batch(cases[first : first + AT_ONCE], identities, folder, pool))
    print(
        "\nseconds to each refusal: "
        + ", ".join(f"{v}-{r} {found[c].waited_s:.0f}" for c in cases for _, _, r, v in [c])
    )
    return found


@pytest.mark.parametrize(
    ("role", "index", "resource", "verb"), _cases(), ids=[f"{v}-{r}" for _, _, r, v in _cases()]
)
def test_each_verb_of_the_chart_role_is_needed(
    verdicts: dict[tuple[str, int, str, str], Verdict], role: str, index: int, resource: str, verb: str
) -> None:
    verdict = verdicts[(role, index, resource, verb)]
    if not verdict.refused:
        pytest.fail(
            f"without {verb} on {resource} ({PARTS[resource]}), the operator never reported "
            f"{_expected(resource, verb)!r} in {verdict.waited_s:.0f} s: is this verb dead?\n"
            f"operator log:\n{verdict.log_tail}",
            pytrace=False,
        )


def test_a_denied_write_is_a_condition_and_an_event_on_the_job(
    identities: Callable[[], Identity], tmp_path: Path
) -> None:
    """Not a silent retry loop: `kubectl describe` shows which verb on which resource was refused."""
    identity = identities()
    cluster = identity.cluster
    rules = [r for r in _chart_rules() if "rayjobs" not in r["resources"]]
    rules.append({"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch"]})
    served = _serve(identity, rules, tmp_path, _lease_rules())
    namespace, operator = served.namespace, served.operator
    try:
        time.sleep(1)  # RBAC changes reach the authorizer's cache within a moment
        operator.start()
        cluster.apply(*_workload(namespace))
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
    finally:
        served.stop()
