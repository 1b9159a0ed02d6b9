"""The Helm chart on the real API server: installed as an admin would, its pod admitted under the
`restricted` Pod Security Standard, and the operator reconciling jobs with the chart's own
ServiceAccount identity (not the admin's), in both namespace modes; upgrade keeps jobs, uninstall
leaves nothing stuck."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_install import deployment_args, helm, token_kubeconfig
from chart_render import CHART
from operator_process import OperatorProcess
from test_operator import _in, condition, in_phase, job, status, wait_for

pytestmark = pytest.mark.e2e

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def _namespace(cluster: Any, prefix: str, labels: dict[str, str] | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    )
    return name


def _gpu_quota(namespace: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }


def _phases_announced(cluster: Any, namespace: str, name: str) -> list[str]:
    """The phases in the operator's "A -> B: ..." events on the job, oldest first."""
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", namespace, f"--field-selector=involvedObject.name={name}", "-o", "json"
        ).stdout
    )["items"]
    events.sort(key=lambda e: e.get("eventTime") or e.get("firstTimestamp") or "")
    return [m.group(1) for e in events if (m := re.match(r"\w+ -> (\w+):", e.get("message", "")))]


class Install:
    """One release of the chart and the operator running with its identity."""

    def __init__(self, cluster: Any, release: str, namespace: str, log_dir: Path, *values: str) -> None:
        self.cluster, self.release, self.namespace = cluster, release, namespace
        helm(cluster, "install", release, str(CHART), "-n", namespace, "--wait", "--timeout=120s", *values)
        self.kubeconfig = token_kubeconfig(cluster, f"{release}-rljob", namespace, log_dir / "kubeconfig")
        args = deployment_args(cluster, namespace, f"{release}-rljob")
        self.operator = OperatorProcess(self.kubeconfig, log_dir, resync_seconds=5, args=args)
        self.operator.start()

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.list("pods", self.namespace, f"app.kubernetes.io/instance={self.release}")

    def stop(self) -> None:
        self.operator.stop()


@pytest.fixture(scope="module")
def installed(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    """The cluster-wide install, in a namespace that enforces the restricted Pod Security Standard,
    with the FlowSchema opted into (it is off by default)."""
    namespace = _namespace(crd, "rljob-system", RESTRICTED)
    install = Install(
        crd, "e2e", namespace, tmp_path_factory.mktemp("chart"), "--set=flowControl.enabled=true"
    )
    yield install
    install.stop()
    helm(crd, "uninstall", install.release, "-n", namespace, "--wait")
    crd.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_operator_pod_is_admitted_under_the_restricted_standard(installed: Install) -> None:
    (pod,) = installed.pods()
    assert pod["status"]["phase"] == "Running", pod["status"]
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "e2e-rljob" and spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _flow_schema_of_a_request(cluster: Any, kubeconfig: Path) -> str:
    """The name of the FlowSchema that API Priority and Fairness classified a request into: the API
    server names its uid in a response header (kubectl -v=8 prints the headers), also on a refusal
    (classification comes before authorization)."""
    proc = subprocess.run(
        [str(cluster.kubectl_bin), f"--kubeconfig={kubeconfig}", "get", "--raw",
         "/apis/rljob.dev/v1alpha1/rltrainingjobs?limit=1", "-v=8"],
        capture_output=True, text=True, timeout=60, env=cluster.env(),
    )  # fmt: skip
    match = re.search(r"X-Kubernetes-Pf-Flowschema-Uid: (\S+)", proc.stderr, re.IGNORECASE)
    assert match, proc.stderr[-2000:]
    schemas = json.loads(cluster.kubectl("get", "flowschemas", "-o", "json").stdout)["items"]
    return next(s["metadata"]["name"] for s in schemas if s["metadata"]["uid"] == match.group(1))


def test_the_operators_requests_are_served_at_the_charts_priority_level(
    installed: Install, crd: Any, tmp_path: Path
) -> None:
    """The chart's FlowSchema (opted into) takes the operator's identity to workload-high; any other
    ServiceAccount's requests stay in service-accounts (workload-low), as the operator's would without it."""
    assert _flow_schema_of_a_request(crd, installed.kubeconfig) == "e2e-rljob"
    schema = json.loads(crd.kubectl("get", "flowschema", "e2e-rljob", "-o", "json").stdout)
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == "workload-high"
    dangling = [c for c in schema["status"]["conditions"] if c["type"] == "Dangling"]
    assert [c["status"] for c in dangling] == ["False"], schema["status"]  # the level exists
    crd.kubectl("create", "serviceaccount", "bystander", "-n", installed.namespace)
    other = token_kubeconfig(crd, "bystander", installed.namespace, tmp_path / "bystander")
    assert _flow_schema_of_a_request(crd, other) == "service-accounts"


def test_the_restricted_standard_refuses_a_privileged_operator_pod(crd: Any, tmp_path: Path) -> None:
    """The control for the test above: the same namespace label refuses a pod that breaks the standard."""
    namespace = _namespace(crd, "rljob-priv", RESTRICTED)
    try:
        helm(
            crd, "install", "priv", str(CHART), "-n", namespace,
            "--set=securityContext.allowPrivilegeEscalation=true",
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            events = json.dumps(crd.list("events", namespace))
            if "violates PodSecurity" in events:
                break
            time.sleep(1)
        else:
            pytest.fail(f"no PodSecurity refusal in 60 s; events: {events}")
        assert crd.list("pods", namespace, "app.kubernetes.io/instance=priv") == []
        assert "allowPrivilegeEscalation != false" in events
    finally:
        helm(crd, "uninstall", "priv", "-n", namespace)
        crd.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_chart_identity_takes_a_job_through_queued_starting_running_succeeded(
    installed: Install, crd: Any
) -> None:
    namespace = _namespace(crd, "team")
    crd.apply(_gpu_quota(namespace, 8))
    crd.apply(_in(namespace, job("first", entrypoint="python -c 'import time; time.sleep(25)'")))
    operator = installed.operator
    wait_for("first Running", in_phase(crd, namespace, "first", "Running"), operator)
    # Long enough that a reconcile sees it Running even on a busy machine (phases may not be skipped).
    crd.apply(_in(namespace, job("second", entrypoint="python -c 'import time; time.sleep(12)'")))
    wait_for("second Queued", in_phase(crd, namespace, "second", "Queued"), operator)
    wait_for("first Succeeded", in_phase(crd, namespace, "first", "Succeeded"), operator)
    done = wait_for("second Succeeded", in_phase(crd, namespace, "second", "Succeeded", "Failed"), operator)
    assert done["phase"] == "Succeeded", json.dumps(done, indent=1)
    phases = _phases_announced(crd, namespace, "second")
    seen = [p for p in phases if p in ("Queued", "Starting", "Running", "Succeeded")]
    assert seen == ["Queued", "Starting", "Running", "Succeeded"], phases
    denied = [line for line in operator.log_path.read_text().splitlines() if "permission denied" in line]
    assert not [line for line in denied if namespace in line], denied
    # The operator made the runtime's identity with the chart's: ServiceAccount, Role, RoleBinding.
    assert crd.get("rolebinding", "second-runtime", namespace) is not None
    crd.kubectl("delete", "namespace", namespace, "--wait=false")


def test_a_missing_secret_shows_as_the_pods_config_error_without_reading_secrets(
    installed: Install, crd: Any
) -> None:
    """The default install may not read Secrets: the pods' CreateContainerConfigError says it."""
    namespace = _namespace(crd, "nosecret")
    spec = {"resources": {"secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}}}}
    crd.apply(_in(namespace, job("needs-hf", spec)))
    operator = installed.operator
    wait_for("pods exist", lambda: crd.list("pods", namespace, "rljob.dev/job=needs-hf"), operator)
    # kwok starts every container; play the kubelet that cannot find the Secret.
    for pod in crd.list("pods", namespace, "rljob.dev/job=needs-hf"):
        (container,) = pod["spec"]["containers"]
        waiting = {"reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}
        patch = {"status": {"containerStatuses": [{"name": container["name"], "ready": False,
                 "restartCount": 0, "image": container["image"], "imageID": "",
                 "state": {"waiting": waiting}}]}}  # fmt: skip
        crd.kubectl(
            "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps(patch),
        )  # fmt: skip

    def stalled() -> dict[str, Any] | None:
        st = status(crd, namespace, "needs-hf")
        return st if condition(st, "Stalled").get("reason") == "CreateContainerConfigError" else None

    st = wait_for("Stalled with the pod's reason", stalled, operator, timeout=60)
    assert 'secret "hf" not found' in condition(st, "Stalled")["message"]
    crd.kubectl("delete", "namespace", namespace, "--wait=false")


def _can_i(cluster: Any, user: str, verb: str, namespace: str) -> bool:
    proc = cluster.kubectl(
        "auth", "can-i", verb, "rltrainingjobs.rljob.dev", "-n", namespace, f"--as={user}", check=False
    )
    return proc.stdout.strip() == "yes"


def test_people_bound_to_the_built_in_edit_and_view_roles_get_jobs(installed: Install, crd: Any) -> None:
    """The chart's editor and viewer ClusterRoles reach people through the built-in `edit` and `view`
    ClusterRoles, aggregated by the cluster's own controller (kube-controller-manager): a user bound to
    `edit` in a namespace creates a job there, a user bound to `view` reads it but cannot create one,
    and neither writes its status."""
    namespace = _namespace(crd, "people")
    suffix = uuid.uuid4().hex[:6]
    editor, viewer = f"editor-{suffix}", f"viewer-{suffix}"
    crd.apply(
        *(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{role}-{user}", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }
            for role, user in (("edit", editor), ("view", viewer))
        )
    )
    deadline = time.monotonic() + 60  # the aggregation controller and the authorizer's cache
    while not (_can_i(crd, editor, "create", namespace) and _can_i(crd, viewer, "list", namespace)):
        if time.monotonic() > deadline:
            edit = crd.kubectl("get", "clusterrole", "edit", "-o", "yaml").stdout
            pytest.fail(f"the built-in edit and view roles did not take the chart's rules in 60 s:\n{edit}")
        time.sleep(1)
    aggregated = json.loads(crd.kubectl("get", "clusterrole", "edit", "view", "-o", "json").stdout)["items"]
    for role in aggregated:  # the rules are in the built-in roles themselves
        assert any("rltrainingjobs" in rule.get("resources", []) for rule in role["rules"]), role

    manifest = json.dumps(_in(namespace, job("by-an-editor")))
    created = crd.kubectl("create", "-f", "-", f"--as={editor}", input=manifest, check=False)
    assert created.returncode == 0, created.stderr
    seen = crd.kubectl("get", "rljob", "by-an-editor", "-n", namespace, f"--as={viewer}", "-o", "json")
    assert json.loads(seen.stdout)["metadata"]["name"] == "by-an-editor"
    listed = crd.kubectl("get", "rljobs", "-n", namespace, f"--as={viewer}", "-o", "name")
    assert listed.stdout.split() == ["rltrainingjob.rljob.dev/by-an-editor"]

    other = json.dumps(_in(namespace, job("by-a-viewer")))
    refused = crd.kubectl("create", "-f", "-", f"--as={viewer}", input=other, check=False)
    assert refused.returncode != 0 and 'cannot create resource "rltrainingjobs"' in refused.stderr, (
        refused.stderr
    )
    status = json.dumps({"status": {"phase": "Succeeded"}})
    for user in (editor, viewer):  # the status is the operator's to write
        patched = crd.kubectl(
            "patch", "rljob", "by-an-editor", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", status, f"--as={user}", check=False,
        )  # fmt: skip
        assert patched.returncode != 0 and "cannot patch resource" in patched.stderr, patched.stderr
    deleted = crd.kubectl("delete", "rljob", "by-an-editor", "-n", namespace, f"--as={editor}", check=False)
    assert deleted.returncode == 0, deleted.stderr
    crd.kubectl("delete", "namespace", namespace, "--wait=false")
