"""Rule and schema cases for what reaches the job's pods: volumes, labels, annotations, env.

Tuples of Case's fields (spec_cases turns them into Cases and adds them to its tables, which the
unit tests and the real-API-server suite both run)."""

from __future__ import annotations

from typing import Any

PVC = {"persistentVolumeClaim": {"claimName": "models"}}


def _vol(**fields: Any) -> dict[str, Any]:
    return {"resources": {"volumes": [{"name": "models", "mountPath": "/shared/models", **PVC, **fields}]}}


def _two(a: str, b: str) -> dict[str, Any]:
    return {
        "resources": {
            "volumes": [
                {"name": "a", "mountPath": a, **PVC},
                {"name": "b", "mountPath": b, "emptyDir": {}},
            ]
        }
    }


POD_RULE_CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    (
        "volume-two-sources",
        _vol(emptyDir={}),
        "spec.resources.volumes[0].persistentVolumeClaim",
        "set exactly one of persistentVolumeClaim",
        _vol(),
    ),
    (
        "volume-no-source",
        {"resources": {"volumes": [{"name": "models", "mountPath": "/shared/models"}]}},
        "spec.resources.volumes[0].persistentVolumeClaim",
        "set exactly one of persistentVolumeClaim",
        _vol(),
    ),
    (
        "volume-over-dev-shm",
        _vol(mountPath="/dev/shm"),
        "spec.resources.volumes[0].mountPath",
        "overlaps a path the operator mounts itself",
        _vol(mountPath="/dev/shmx"),
    ),
    (
        "volume-above-model-cache",
        _vol(mountPath="/var/cache"),
        "spec.resources.volumes[0].mountPath",
        "overlaps a path the operator mounts itself",
        _vol(mountPath="/var/cache2"),
    ),
    (
        "volume-dot-dot",
        _vol(mountPath="/shared/../etc"),
        "spec.resources.volumes[0].mountPath",
        "'..' segment",
        _vol(mountPath="/shared/..etc"),
    ),
    (
        "volume-sub-path-dot-dot",
        _vol(subPath="a/../../b"),
        "spec.resources.volumes[0].subPath",
        "'..' segment",
        _vol(subPath="a/b"),
    ),
    (
        "volume-reserved-name",
        _vol(name="dshm"),
        "spec.resources.volumes[0].name",
        "used by the operator's own volumes",
        _vol(name="shm"),
    ),
    (
        "volume-duplicate-names",
        {
            "resources": {
                "volumes": [
                    {"name": "a", "mountPath": "/a", **PVC},
                    {"name": "a", "mountPath": "/b", "emptyDir": {}},
                ]
            }
        },
        "spec.resources.volumes",
        "names must be unique",
        _two("/a", "/b"),
    ),
    (
        "volume-nested-mounts",
        _two("/shared", "/shared/data"),
        "spec.resources.volumes",
        "mount paths may not be equal or nested",
        _two("/shared/models", "/shared/data"),
    ),
    (
        "volume-over-checkpoints",
        {**_vol(mountPath="/shared"), "checkpoint": {"path": "/shared/checkpoints/run"}},
        "spec.resources.volumes",
        "overlaps checkpoint.path",
        {**_vol(mountPath="/shared/models"), "checkpoint": {"path": "/shared/checkpoints/run"}},
    ),
    (
        "checkpoint-under-dev-shm",
        {"checkpoint": {"path": "/dev/shm/ckpt"}},
        "spec.checkpoint.path",
        "overlaps a path the operator mounts itself",
        {"checkpoint": {"path": "/ckpt"}},
    ),
    (
        "env-operator-variable",
        {"resources": {"env": [{"name": "HF_HOME", "value": "/x"}]}},
        "spec.resources.env",
        "may not set a variable the operator or KubeRay sets",
        {"resources": {"env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}},
    ),
    (
        "group-env-kuberay-variable",
        {"resources": {"trainer": {"env": [{"name": "RAY_ADDRESS", "value": "x:1"}]}}},
        "spec.resources.trainer.env",
        "may not set a variable the operator or KubeRay sets",
        {"resources": {"trainer": {"env": [{"name": "RAY_DEDUP_LOGS", "value": "0"}]}}},
    ),
    (
        "label-bad-key",
        {"resources": {"labels": {"bad key": "x"}}},
        "spec.resources.labels",
        "keys must be qualified names",
        {"resources": {"labels": {"good-key": "x"}}},
    ),
    (
        "node-selector-bad-key",
        {"resources": {"trainer": {"nodeSelector": {"gpu pool": "a"}}}},
        "spec.resources.trainer.nodeSelector",
        "keys must be qualified names",
        {"resources": {"trainer": {"nodeSelector": {"example.com/gpu-pool": "a"}}}},
    ),
    (
        "label-reserved-prefix",
        {"resources": {"rollout": {"labels": {"ray.io/node-type": "x"}}}},
        "spec.resources.rollout.labels",
        "may not use the prefixes",
        {"resources": {"rollout": {"labels": {"team.example.com/owner": "x"}}}},
    ),
]

POD_SCHEMA_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (a relative mountPath, an absolute subPath: rule cases in spec_cases_safety)
    ("volume-bad-name", _vol(name="Models"), "spec.resources.volumes[0].name", ""),
    (
        "volume-host-path-type",
        {
            "resources": {
                "volumes": [{"name": "c", "mountPath": "/c", "hostPath": {"path": "/c", "type": "Socket"}}]
            }
        },
        "spec.resources.volumes[0].hostPath.type",
        "",
    ),
    (
        "label-bad-value",
        {"resources": {"head": {"labels": {"team": "a b"}}}},
        "spec.resources.head.labels.team",
        "",
    ),
    (
        "toleration-bad-key",
        {"resources": {"tolerations": [{"key": "-gpu", "operator": "Exists"}]}},
        "spec.resources.tolerations[0].key",
        "",
    ),
    (
        "root-user",
        {"resources": {"securityContext": {"runAsUser": 0}}},
        "spec.resources.securityContext.runAsUser",
        "",
    ),
]

POD_RULE_CASES += [
    (
        "toleration-empty-key-needs-exists",
        {"resources": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
        "spec.resources.tolerations[0].operator",
        "operator must be Exists when key is empty",
        {"resources": {"tolerations": [{"operator": "Exists"}]}},
    ),
    (
        "toleration-seconds-need-no-execute",
        {"resources": {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]}},
        "spec.resources.tolerations[0].tolerationSeconds",
        "tolerationSeconds needs effect NoExecute",
        {
            "resources": {
                "tolerations": [
                    {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
                ]
            }
        },
    ),
]
POD_SCHEMA_CASES += [
    ("negative-memory", {"resources": {"head": {"memory": "-1Gi"}}}, "spec.resources.head.memory", ""),
    ("bad-image", {"resources": {"image": "Registry/Runtime:latest"}}, "spec.resources.image", ""),
    ("image-with-space", {"resources": {"image": "rljob/runtime :1"}}, "spec.resources.image", ""),
    (
        "bad-priority-class",
        {"resources": {"priorityClassName": "High Priority"}},
        "spec.resources.priorityClassName",
        "",
    ),
    (
        "annotation-too-long",
        {"resources": {"annotations": {"a": "x" * 2049}}},
        "spec.resources.annotations.a",
        "",
    ),
]

# Affinity: core/v1 Affinity typed, with pod validation's rules (ValidateNodeSelectorRequirement,
# validatePodAffinityTerm, ValidateLabelSelector).
_AFF = "spec.resources.affinity"
_NODE_REQ = f"{_AFF}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
_NODE_EXPR = f"{_NODE_REQ}.nodeSelectorTerms[0].matchExpressions[0]"
_NODE_PREF = f"{_AFF}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
_POD_TERM = f"{_AFF}.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
_ANTI_TERM = f"{_AFF}.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm"


def _affinity(affinity: dict[str, Any]) -> dict[str, Any]:
    return {"resources": {"affinity": affinity}}


def _node_term(term: dict[str, Any]) -> dict[str, Any]:
    return _affinity(
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    )


def _node_expr(**expr: Any) -> dict[str, Any]:
    return _node_term({"matchExpressions": [{"key": "example.com/gpu", **expr}]})


def _node_pref(**expr: Any) -> dict[str, Any]:
    preferred = [{"weight": 10, "preference": {"matchExpressions": [{"key": "zone", **expr}]}}]
    return _affinity({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}})


def _pod_term(**term: Any) -> dict[str, Any]:
    term = {"topologyKey": "kubernetes.io/hostname", **term}
    return _affinity({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}})


def _anti_term(**term: Any) -> dict[str, Any]:
    term = {"topologyKey": "topology.kubernetes.io/zone", **term}
    preferred = [{"weight": 50, "podAffinityTerm": term}]
    return _affinity({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}})


_ROLE = {"matchLabels": {"rljob.dev/role": "trainer"}}

POD_RULE_CASES += [
    (
        "affinity-node-in-needs-values",
        _node_expr(operator="In"),
        f"{_NODE_EXPR}.values",
        "values must not be empty when operator is In or NotIn",
        _node_expr(operator="In", values=["h100"]),
    ),
    (
        "affinity-node-preferred-not-in-empty-values",
        _node_pref(operator="NotIn", values=[]),
        f"{_NODE_PREF}.preference.matchExpressions[0].values",
        "values must not be empty when operator is In or NotIn",
        _node_pref(operator="NotIn", values=["a"]),
    ),
    (
        "affinity-node-exists-takes-no-values",
        _node_expr(operator="Exists", values=["h100"]),
        f"{_NODE_EXPR}.values",
        "values must be empty when operator is Exists or DoesNotExist",
        _node_expr(operator="Exists"),
    ),
    (
        "affinity-node-gt-two-values",
        _node_expr(operator="Gt", values=["1", "2"]),
        f"{_NODE_EXPR}.values",
        "values must be exactly one integer",
        _node_expr(operator="Gt", values=["1"]),
    ),
    (
        "affinity-node-lt-not-an-integer",
        _node_expr(operator="Lt", values=["1.5"]),
        f"{_NODE_EXPR}.values",
        "values must be exactly one integer",
        _node_expr(operator="Lt", values=["16"]),
    ),
    (
        "affinity-node-gt-no-values",
        _node_expr(operator="Gt"),
        f"{_NODE_EXPR}.values",
        "values must be exactly one integer",
        _node_expr(operator="Gt", values=["0"]),
    ),
    (
        "affinity-label-selector-in-needs-values",
        _pod_term(labelSelector={"matchExpressions": [{"key": "app", "operator": "In"}]}),
        f"{_POD_TERM}.labelSelector.matchExpressions[0].values",
        "values must not be empty when operator is In or NotIn",
        _pod_term(labelSelector={"matchExpressions": [{"key": "app", "operator": "In", "values": ["a"]}]}),
    ),
    (
        "affinity-ns-selector-exists-no-values",
        _anti_term(
            labelSelector={},
            namespaceSelector={
                "matchExpressions": [{"key": "team", "operator": "DoesNotExist", "values": ["a"]}]
            },
        ),
        f"{_ANTI_TERM}.namespaceSelector.matchExpressions[0].values",
        "values must be empty when operator is Exists or DoesNotExist",
        _anti_term(
            labelSelector={},
            namespaceSelector={"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
        ),
    ),
    (
        "affinity-match-labels-bad-key",
        _pod_term(labelSelector={"matchLabels": {"bad key": "x"}}),
        f"{_POD_TERM}.labelSelector.matchLabels",
        "keys must be qualified names",
        _pod_term(labelSelector={"matchLabels": {"example.com/good-key": "x"}}),
    ),
    (
        "affinity-match-label-keys-need-selector",
        _anti_term(matchLabelKeys=["rljob.dev/job"]),
        f"{_ANTI_TERM}.matchLabelKeys",
        "matchLabelKeys must not be set without labelSelector",
        _anti_term(labelSelector=_ROLE, matchLabelKeys=["rljob.dev/job"]),
    ),
    (
        "affinity-mismatch-label-keys-need-selector",
        _pod_term(mismatchLabelKeys=["rljob.dev/job"]),
        f"{_POD_TERM}.mismatchLabelKeys",
        "mismatchLabelKeys must not be set without labelSelector",
        _pod_term(labelSelector=_ROLE, mismatchLabelKeys=["rljob.dev/job"]),
    ),
    (
        "affinity-key-in-match-and-mismatch-keys",
        _pod_term(labelSelector=_ROLE, matchLabelKeys=["rljob.dev/job"], mismatchLabelKeys=["rljob.dev/job"]),
        f"{_POD_TERM}.matchLabelKeys",
        "a key may not also be in mismatchLabelKeys",
        _pod_term(labelSelector=_ROLE, matchLabelKeys=["rljob.dev/job"], mismatchLabelKeys=["team"]),
    ),
    (
        "affinity-match-label-key-in-match-labels",
        _anti_term(labelSelector=_ROLE, matchLabelKeys=["rljob.dev/role"]),
        f"{_ANTI_TERM}.matchLabelKeys",
        "a key may not also be in labelSelector",
        _anti_term(labelSelector=_ROLE, matchLabelKeys=["rljob.dev/job"]),
    ),
    (
        "affinity-match-label-key-in-expressions",
        _pod_term(
            labelSelector={"matchExpressions": [{"key": "rljob.dev/job", "operator": "Exists"}]},
            matchLabelKeys=["rljob.dev/job"],
        ),
        f"{_POD_TERM}.matchLabelKeys",
        "a key may not also be in labelSelector",
        _pod_term(
            labelSelector={"matchExpressions": [{"key": "rljob.dev/role", "operator": "Exists"}]},
            matchLabelKeys=["rljob.dev/job"],
        ),
    ),
]

POD_SCHEMA_CASES += [
    # Typos and wrong types are refused, not pruned: the pods would run without the constraint.
    ("affinity-misspelt-field", _affinity({"nodeAfinity": {}}), f"{_AFF}.nodeAfinity", ""),
    (
        "affinity-misspelt-term-field",
        _pod_term(labelSelecter={"matchLabels": {"app": "a"}}),
        f"{_POD_TERM}.labelSelecter",
        "",
    ),
    ("affinity-wrong-type", _affinity({"podAntiAffinity": []}), f"{_AFF}.podAntiAffinity", ""),
    ("affinity-node-bad-operator", _node_expr(operator="Equals", values=["a"]), f"{_NODE_EXPR}.operator", ""),
    ("affinity-node-bad-key", _node_expr(key="-gpu", operator="Exists"), f"{_NODE_EXPR}.key", ""),
    ("affinity-node-bad-value", _node_expr(operator="In", values=["a b"]), f"{_NODE_EXPR}.values[0]", ""),
    (
        "affinity-no-node-selector-terms",
        _affinity(
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
        ),
        f"{_NODE_REQ}.nodeSelectorTerms",
        "",
    ),
    (
        "affinity-node-weight-zero",
        _affinity(
            {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]
                }
            }
        ),
        f"{_NODE_PREF}.weight",
        "",
    ),
    (
        "affinity-pod-weight-above-100",
        _affinity(
            {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 101, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                    ]
                }
            }
        ),
        f"{_AFF}.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        "",
    ),
    (
        "affinity-weight-string",
        _affinity(
            {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": "10", "preference": {}}]
                }
            }
        ),
        f"{_NODE_PREF}.weight",
        "",
    ),
    (
        "affinity-match-fields-key",
        _node_term({"matchFields": [{"key": "metadata.namespace", "operator": "In", "values": ["a"]}]}),
        f"{_NODE_REQ}.nodeSelectorTerms[0].matchFields[0].key",
        "",
    ),
    (
        "affinity-match-fields-operator",
        _node_term({"matchFields": [{"key": "metadata.name", "operator": "Exists", "values": ["node-1"]}]}),
        f"{_NODE_REQ}.nodeSelectorTerms[0].matchFields[0].operator",
        "",
    ),
    (
        "affinity-match-fields-two-values",
        _node_term(
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1", "node-2"]}]}
        ),
        f"{_NODE_REQ}.nodeSelectorTerms[0].matchFields[0].values",
        "",
    ),
    (
        "affinity-topology-key-missing",
        _affinity({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}),
        f"{_POD_TERM}.topologyKey",
        "",
    ),
    ("affinity-topology-key-empty", _pod_term(topologyKey=""), f"{_POD_TERM}.topologyKey", ""),
    ("affinity-bad-namespace", _pod_term(namespaces=["Team_A"]), f"{_POD_TERM}.namespaces[0]", ""),
    (
        "affinity-bad-match-label-key",
        _pod_term(labelSelector={}, matchLabelKeys=["bad key"]),
        f"{_POD_TERM}.matchLabelKeys[0]",
        "",
    ),
    (
        "affinity-bad-match-label-value",
        _pod_term(labelSelector={"matchLabels": {"app": "a b"}}),
        f"{_POD_TERM}.labelSelector.matchLabels.app",
        "",
    ),
]
