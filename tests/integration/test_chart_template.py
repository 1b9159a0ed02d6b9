"""The Helm chart rendered by the real helm: `helm lint`, golden manifests for the two install
shapes, refusals of values that make no sense, the restricted Pod Security Standard's fields, and
the copies it carries (CRD, dashboard) equal to their sources.

Regenerate the goldens after an intended change: RLJOB_UPDATE_GOLDEN=1 pytest tests/integration/test_chart_template.py
"""

from __future__ import annotations

import base64
import json
import os
import re
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


def _operator_role(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's ClusterRole (the others are the people's, aggregated into edit and view)."""
    (role,) = [o for o in _by_kind(objs, "ClusterRole") if o["metadata"]["name"] == "rljob"]
    return role


def test_cluster_mode_has_one_cluster_role_and_no_secret_access() -> None:
    objs = render()
    assert _kinds(objs) == [
        ("ServiceAccount", "rljob-system", "rljob"),
        ("ClusterRole", "", "rljob"),
        ("ClusterRole", "", "rljob-editor"),
        ("ClusterRole", "", "rljob-viewer"),
        ("ClusterRoleBinding", "", "rljob"),
        ("Role", "rljob-system", "rljob-leader"),
        ("RoleBinding", "rljob-system", "rljob-leader"),
        ("Service", "rljob-system", "rljob-metrics"),
        ("Deployment", "rljob-system", "rljob"),
    ]
    role = _operator_role(objs)
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert "secrets" not in resources and "nodes" in resources and "rayjobs" in resources
    assert all("*" not in rule["verbs"] + rule["resources"] for rule in role["rules"])


def test_namespaced_mode_grants_per_namespace_and_only_nodes_cluster_wide() -> None:
    objs = render(*SHAPES["chart-namespaced.yaml"])
    cluster_role = _operator_role(objs)
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    roles = _by_kind(objs, "Role")
    assert [r["metadata"]["namespace"] for r in roles] == [
        "team-a",
        "team-b",
        "rljob-system",
    ]  # + the lease's
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in roles[0]["rules"]
    bindings = _by_kind(objs, "RoleBinding")
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b", "rljob-system"]
    (deploy,) = _by_kind(objs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=team-a", "--namespace=team-b", "--secret-preflight"} <= set(args)
    (monitor,) = _by_kind(objs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_operator_pod_passes_the_restricted_pod_security_standard() -> None:
    (deploy,) = _by_kind(render(), "Deployment")
    assert deploy["spec"]["replicas"] == 1
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
    (
        ("replicas=2", "leaderElection.enabled=false"),
        "replicas: 2 needs leaderElection.enabled: true; without leader election every replica would",
    ),
    (
        ("leaderElection.renewDeadlineSeconds=10",),
        "leaderElection.renewDeadlineSeconds (10) must be less than leaderElection.leaseDurationSeconds (10)",
    ),
    (
        ("leaderElection.retryPeriodSeconds=6",),
        "leaderElection.renewDeadlineSeconds (7) must be more than 1.2 times leaderElection.retryPeriodSeconds (6)",
    ),
    (("leaderElection.leaseDurationSeconds=0",), "at '/leaderElection/leaseDurationSeconds'"),
    (("leaderElection.retryPeriodSeconds=0.5",), "at '/leaderElection/retryPeriodSeconds'"),
    (("replicas=-1",), "at '/replicas'"),
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
    """API Priority and Fairness, opted into: the operator's identity (whatever its name) at the chosen
    level."""
    (schema,) = _by_kind(
        render("serviceAccount.name=ops", "flowControl.enabled=true", "flowControl.priorityLevel=my-level"),
        "FlowSchema",
    )
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": "my-level"}
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "ops", "namespace": "rljob-system"}}
    ]
    (resources,) = rule["resourceRules"]
    assert resources["clusterScope"] is True and resources["namespaces"] == ["*"]
    assert _by_kind(render(), "FlowSchema") == []  # off by default: the admin's choice


def test_people_get_jobs_through_the_built_in_edit_and_view_roles() -> None:
    """Aggregated ClusterRoles: `edit` (and `admin`) may do everything to jobs but write their status,
    `view` may read them; the built-in roles take these rules by their labels."""
    roles = {o["metadata"]["name"]: o for o in _by_kind(render(), "ClusterRole")}
    editor, viewer = roles["rljob-editor"], roles["rljob-viewer"]

    def aggregated_into(role: dict[str, Any]) -> dict[str, str]:
        prefix = "rbac.authorization.k8s.io/aggregate-to-"
        labels = role["metadata"]["labels"]
        return {k.removeprefix(prefix): v for k, v in labels.items() if k.startswith(prefix)}

    assert aggregated_into(editor) == {"edit": "true", "admin": "true"}
    assert aggregated_into(viewer) == {"view": "true"}
    grants = {
        name: {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
        for name, role in (("editor", editor), ("viewer", viewer))
    }
    assert all(rule["apiGroups"] == ["rljob.dev"] for rule in editor["rules"] + viewer["rules"])
    read = {"get", "list", "watch"}
    assert grants["editor"] == {
        ("rltrainingjobs", v) for v in (*read, "create", "update", "patch", "delete", "deletecollection")
    } | {("rltrainingjobs/status", v) for v in read}
    assert grants["viewer"] == {(r, v) for r in ("rltrainingjobs", "rltrainingjobs/status") for v in read}
    names = {
        o["metadata"]["name"] for o in _by_kind(render("rbac.aggregateToDefaultRoles=false"), "ClusterRole")
    }
    assert names == {"rljob"}


def test_chart_metadata_names_a_home_an_icon_and_an_example_that_exists() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://")
    prefix = "data:image/svg+xml;base64,"
    assert chart["icon"].startswith(prefix)
    assert base64.b64decode(chart["icon"][len(prefix) :]) == (CHART / "icon.svg").read_bytes()
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    examples = re.findall(r"kubectl apply -f (\S+)", notes)
    assert examples and all((REPO / path).is_file() for path in examples), examples


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


def _deployment(*values: str) -> dict[str, Any]:
    (deploy,) = _by_kind(render(*values), "Deployment")
    return deploy


def test_replicas_take_turns_through_a_lease_only_the_operator_may_renew() -> None:
    """Leader election (on by default): the operator's flags name the release namespace's Lease, the
    chart's Role lets the ServiceAccount create leases and read and renew only that one, the Deployment
    rolls (a new pod waits for the old one's lease) and more than one replica spread over nodes."""
    objs = render("replicas=2")
    deploy = _deployment("replicas=2")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [a for a in args if a.startswith("--leader-elect")]
    assert flags == [
        "--leader-elect",
        "--leader-election-namespace=rljob-system",
        "--leader-election-name=rljob-leader",
        "--leader-election-lease-duration=10",
        "--leader-election-renew-deadline=7",
        "--leader-election-retry-period=1",
    ]
    from rljob_operator.__main__ import build_parser
    from rljob_operator.election import election_from_args

    parser = build_parser()
    election = election_from_args(parser.parse_args(flags), parser)
    assert election is not None and (election.namespace, election.name) == ("rljob-system", "rljob-leader")
    assert not election.timing.problems()
    (lease_role,) = [r for r in _by_kind(objs, "Role") if r["metadata"]["name"] == "rljob-leader"]
    assert lease_role["metadata"]["namespace"] == "rljob-system"
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["rljob-leader"],
            "verbs": ["get", "update"],
        },
    ]
    (binding,) = [b for b in _by_kind(objs, "RoleBinding") if b["metadata"]["name"] == "rljob-leader"]
    assert binding["roleRef"]["name"] == "rljob-leader" and binding["subjects"][0]["name"] == "rljob"
    spread = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert "affinity" not in _deployment()["spec"]["template"]["spec"]  # one replica: nothing to spread
    own = {"nodeAffinity": {"x": 1}}
    assert (
        _deployment("replicas=2", "affinity.nodeAffinity.x=1")["spec"]["template"]["spec"]["affinity"] == own
    )


def test_without_leader_election_one_operator_is_recreated_and_holds_no_lease() -> None:
    objs = render("leaderElection.enabled=false")
    deploy = _deployment("leaderElection.enabled=false")
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--leader")]
    assert not [o for o in objs if o["metadata"]["name"].endswith("-leader")]
