"""The Helm chart rendered by the real helm: `helm lint`, golden manifests for the two install
shapes, refusals of values that make no sense, the restricted Pod Security Standard's fields, and
the copies it carries (CRD, dashboard) equal to their sources.

Regenerate the goldens after an intended change: RLJOB_UPDATE_GOLDEN=1 pytest tests/integration/test_chart_template.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHART, REPO, helm_binary, render, template

GOLDEN = Path(__file__).parent / "golden"
SHAPES = {
    "chart-cluster.yaml": (),
    "chart-namespaced.yaml": (
        "namespaceMode=namespaced",
        "watchNamespaces={team-a,team-b}",
        "operator.secretPreflight=true",
        "metrics.serviceMonitor.enabled=true",
    ),
}


def _kinds(objs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs]


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def test_helm_lint_passes_strict() -> None:
    proc = subprocess.run(
        [str(helm_binary()), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("golden", sorted(SHAPES))
def test_rendered_manifests_match_the_golden(golden: str) -> None:
    proc = template(*(f"--set={v}" for v in SHAPES[golden]))
    assert proc.returncode == 0, proc.stderr
    path = GOLDEN / golden
    if os.environ.get("RLJOB_UPDATE_GOLDEN") == "1":
        path.write_text(proc.stdout)
    assert proc.stdout == path.read_text(), f"{golden} changed: review and regenerate (see module docstring)"


def test_cluster_mode_has_one_cluster_role_and_no_secret_access() -> None:
    objs = render()
    assert [k for k, _, _ in _kinds(objs)] == [
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment", "FlowSchema",
    ]  # fmt: skip
    (role,) = _by_kind(objs, "ClusterRole")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert "secrets" not in resources and "nodes" in resources and "rayjobs" in resources
    assert all("*" not in rule["verbs"] + rule["resources"] for rule in role["rules"])


def test_namespaced_mode_grants_per_namespace_and_only_nodes_cluster_wide() -> None:
    objs = render(*SHAPES["chart-namespaced.yaml"])
    (cluster_role,) = _by_kind(objs, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    roles = _by_kind(objs, "Role")
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in roles[0]["rules"]
    assert [b["metadata"]["namespace"] for b in _by_kind(objs, "RoleBinding")] == ["team-a", "team-b"]
    (deploy,) = _by_kind(objs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=team-a", "--namespace=team-b", "--secret-preflight"} <= set(args)
    (monitor,) = _by_kind(objs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_operator_pod_passes_the_restricted_pod_security_standard() -> None:
    (deploy,) = _by_kind(render(), "Deployment")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert container["image"] == "rljob/operator:0.1.0"  # the chart's appVersion
    probes = {p: container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/metrics"}


REFUSED = [
    (("replicas=2",), "no leader election yet, so replicas must be 1"),
    (("namespaceMode=everywhere",), "at '/namespaceMode': value must be one of 'cluster', 'namespaced'"),
    (("namespaceMode=namespaced",), "namespaceMode: namespaced needs watchNamespaces"),
    (("watchNamespaces={a}",), "watchNamespaces is only used with namespaceMode: namespaced"),
    (("operator.secretPreflight=true",), "operator.secretPreflight needs namespaceMode: namespaced"),
    (("image.tag=has:colon",), "at '/image/tag'"),
    (("image.repository=",), "at '/image/repository'"),
    (("operator.submissionMode=Shell",), "at '/operator/submissionMode'"),
    (("metrics.port=70000",), "at '/metrics/port'"),
    (("unknownKey=1",), "additional properties 'unknownKey' not allowed"),
    (
        ("metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"),
        "metrics.serviceMonitor.enabled needs metrics.service.enabled",
    ),
    (("serviceAccount.create=false",), "serviceAccount.name is required when serviceAccount.create is false"),
    (("jobPods.allowedHostPaths={relative/dir}",), "at '/jobPods/allowedHostPaths/0'"),
    (("jobPods.gpuCapabilities={ipc_lock}",), "at '/jobPods/gpuCapabilities/0'"),
    (("kueue.manageJobsWithoutQueueName=yes",), "at '/kueue/manageJobsWithoutQueueName'"),
    (("flowControl.matchingPrecedence=1",), "at '/flowControl/matchingPrecedence'"),  # exempt's own
    (("flowControl.priorityLevel=",), "at '/flowControl/priorityLevel'"),
]


def test_job_pod_policy_values_become_operator_flags() -> None:
    def args(*values: str) -> list[str]:
        (deployment,) = _by_kind(render(*values), "Deployment")
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    default = args()
    assert not any(
        a.startswith(("--allow-host-path", "--gpu-capability", "--no-", "--kuberay-")) for a in default
    )
    custom = args(
        "jobPods.allowedHostPaths={/mnt/nvme,/data}",
        "jobPods.gpuCapabilities={IPC_LOCK}",
        "jobPods.rayAuth=false",
        "jobPods.networkPolicy=false",
        "jobPods.kuberayNamespace=ray-system",
    )
    for flag in (
        "--allow-host-path=/mnt/nvme",
        "--allow-host-path=/data",
        "--gpu-capability=IPC_LOCK",
        "--no-ray-auth",
        "--no-network-policy",
        "--kuberay-namespace=ray-system",
    ):
        assert flag in custom
    # The operator accepts exactly these flags.
    from rljob_operator.__main__ import build_parser

    parsed = build_parser().parse_args(
        [a for a in custom if not a.startswith(("--metrics-port", "--liveness"))]
    )
    assert parsed.allow_host_path == ["/mnt/nvme", "/data"] and parsed.gpu_capability == ["IPC_LOCK"]
    assert (
        parsed.ray_auth is False
        and parsed.network_policy is False
        and parsed.kuberay_namespace == "ray-system"
    )


def test_kueue_value_becomes_the_operator_flag() -> None:
    def args(*values: str) -> list[str]:
        (deployment,) = _by_kind(render(*values), "Deployment")
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    flag = "--kueue-manage-jobs-without-queue-name"
    assert flag not in args()
    assert flag in args("kueue.manageJobsWithoutQueueName=true")
    from rljob_operator.__main__ import build_parser

    assert build_parser().parse_args([flag]).kueue_manage_jobs_without_queue_name is True


def test_the_flow_schema_classifies_the_operators_service_account() -> None:
    """API Priority and Fairness: the operator's identity (whatever its name) at the chosen level."""
    (schema,) = _by_kind(
        render("serviceAccount.name=ops", "flowControl.priorityLevel=my-level"), "FlowSchema"
    )
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": "my-level"}
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "ops", "namespace": "rljob-system"}}
    ]
    (resources,) = rule["resourceRules"]
    assert resources["clusterScope"] is True and resources["namespaces"] == ["*"]
    assert _by_kind(render("flowControl.enabled=false"), "FlowSchema") == []


@pytest.mark.parametrize(("values", "message"), REFUSED, ids=[v[0][0] for v in REFUSED])
def test_values_that_make_no_sense_are_refused_with_a_clear_message(
    values: tuple[str, ...], message: str
) -> None:
    proc = template(*(f"--set={v}" for v in values))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_the_chart_carries_the_crd_and_the_dashboard_unchanged() -> None:
    for crd in (REPO / "crds").glob("*.yaml"):
        assert (CHART / "crds" / crd.name).read_text() == crd.read_text(), "run make crds"
    objs = render("grafanaDashboard.enabled=true")
    (dashboard,) = [o for o in _by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["rljob-operator.json"])
    assert shipped == json.loads((CHART / "dashboards" / "rljob-operator.json").read_text())


def test_values_yaml_documents_every_schema_key() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]) - {"global"}
