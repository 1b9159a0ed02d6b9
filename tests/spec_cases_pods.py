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
    ("volume-relative-mount", _vol(mountPath="shared"), "spec.resources.volumes[0].mountPath", ""),
    ("volume-bad-name", _vol(name="Models"), "spec.resources.volumes[0].name", ""),
    ("volume-absolute-sub-path", _vol(subPath="/abs"), "spec.resources.volumes[0].subPath", ""),
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
