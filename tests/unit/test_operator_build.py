"""Pure builders against golden files (UPDATE_GOLDEN=1 rewrites them), plus the properties that
matter most spelled out as assertions."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from operator_fixtures import job_from_example, job_from_spec

from rljob_api.contract import ENTRYPOINT, HF_TOKEN_PATH, JOB_ENV
from rljob_api.resource import parse_document
from rljob_operator.build import BuildSettings, build_prerequisites, build_rayjob
from rljob_operator.build_rbac import build_runtime_rbac

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted(
    p.name for p in (Path(__file__).resolve().parents[2] / "examples" / "manifests").glob("*.yaml")
)


def _render(objs: list[dict]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False, width=100)


@pytest.mark.parametrize("example", EXAMPLES)
def test_children_match_golden_files(example: str) -> None:
    job = job_from_example(example)
    text = _render(
        [*build_prerequisites(job, BuildSettings()), build_rayjob(job, BuildSettings(), suspend=False)]
    )
    golden = GOLDEN / example.replace(".yaml", ".children.yaml")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text(), f"{golden} differs: review, then UPDATE_GOLDEN=1 to accept"


def test_colocated_job_has_one_gpu_group_with_its_custom_resource() -> None:
    rayjob = build_rayjob(job_from_example("grpo-job.yaml"), BuildSettings(), suspend=False)
    groups = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["gpu"]
    assert groups[0]["resources"] == {"rljob_colocated": "8"}
    container = groups[0]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert groups[0]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_disaggregated_job_has_trainer_and_rollout_groups_on_their_pools() -> None:
    rayjob = build_rayjob(job_from_example("grpo-disaggregated.yaml"), BuildSettings(), suspend=False)
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert set(groups) == {"trainer", "rollout"}
    assert groups["trainer"]["replicas"] == 1 and groups["trainer"]["resources"] == {"rljob_trainer": "8"}
    assert groups["rollout"]["replicas"] == 2 and groups["rollout"]["resources"] == {"rljob_rollout": "4"}
    assert groups["rollout"]["template"]["spec"]["nodeSelector"] == {"rljob.dev/gpu-pool": "l4"}
    assert groups["trainer"]["template"]["spec"]["nodeSelector"] == {"rljob.dev/gpu-pool": "h100"}
    limits = groups["rollout"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4"


def test_cpu_job_requests_no_gpus_but_advertises_slots() -> None:
    rayjob = build_rayjob(job_from_example("grpo-cpu-demo.yaml"), BuildSettings(), suspend=False)
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["resources"] == {"rljob_colocated": "1"}
    pods = [rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"], group["template"]]
    assert all("nvidia.com/gpu" not in json.dumps(p["spec"]["containers"][0]["resources"]) for p in pods)
    assert all("dshm" not in json.dumps(p["spec"]["volumes"]) for p in pods)


def test_entrypoint_receives_the_resolved_job() -> None:
    job = job_from_example("grpo-job.yaml", generation=3)
    spec = build_rayjob(job, BuildSettings(), suspend=False)["spec"]
    assert spec["entrypoint"] == ENTRYPOINT
    document = json.loads(yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"][JOB_ENV])
    assert document["metadata"] == {
        "name": "qwen3-4b-math",
        "namespace": "ml",
        "uid": "uid-qwen3-4b-math",
        "generation": 3,
    }
    resolved, _ = parse_document(document)
    assert resolved == job.spec


def test_entrypoint_annotation_replaces_the_runtime_command_for_debugging() -> None:
    job = job_from_spec(annotations={"rljob.dev/entrypoint": "sleep 3600"})
    spec = build_rayjob(job, BuildSettings(), suspend=False)["spec"]
    assert spec["entrypoint"] == "sleep 3600" and JOB_ENV in spec["runtimeEnvYAML"]


def test_entrypoint_env_annotation_goes_before_every_entrypoint() -> None:
    from rljob_operator.build import build_conversion_rayjob
    from rljob_operator.conversions import export_conversion

    job = job_from_spec(annotations={"rljob.dev/entrypoint-env": "RLJOB_CACHE=/tmp/c HF_HOME=/tmp/h"})
    training = build_rayjob(job, BuildSettings(), suspend=False)["spec"]["entrypoint"]
    conversion = build_conversion_rayjob(job, BuildSettings(), export_conversion(job, 1))["spec"][
        "entrypoint"
    ]
    assert training == "RLJOB_CACHE=/tmp/c HF_HOME=/tmp/h rljob-runtime train --config env:RLJOB_JOB"
    assert conversion.startswith("RLJOB_CACHE=/tmp/c HF_HOME=/tmp/h rljob-runtime convert export ")


def test_lifecycle_fields_come_from_the_spec() -> None:
    job = job_from_spec(
        {
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
            "faultTolerance": {"backoffLimit": 2},
            "queueName": "team-a",
        }
    )
    rayjob = build_rayjob(job, BuildSettings(submission_mode="K8sJobMode"), suspend=True)
    spec = rayjob["spec"]
    # backoffLimit: the operator restarts the job itself (KubeRay would retry every failure)
    assert (spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"], spec["backoffLimit"]) == (
        3600,
        60,
        0,
    )
    assert spec["shutdownAfterJobFinishes"] is True and spec["suspend"] is True
    assert spec["submissionMode"] == "K8sJobMode"
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert rayjob["metadata"]["ownerReferences"][0]["controller"] is True


# Every kind of affinity term, as a user writes it.
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}
                    ]
                },
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]},
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "preference": {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]},
            }
        ],
    },
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "data"}}, "topologyKey": "topology.kubernetes.io/zone"}
        ]
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchExpressions": [{"key": "rljob.dev/role", "operator": "Exists"}]},
                    "namespaceSelector": {},
                    "topologyKey": "kubernetes.io/hostname",
                    "mismatchLabelKeys": ["rljob.dev/job"],
                },
            }
        ]
    },
}


def test_placement_env_and_secrets_reach_every_pod() -> None:
    job = job_from_spec(
        {
            "resources": {
                "nodeSelector": {"zone": "a"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "affinity": AFFINITY,
                "priorityClassName": "high",
                "env": [{"name": "X", "value": "1"}],
                "secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}},
            }
        }
    )
    cluster = build_rayjob(job, BuildSettings(), suspend=False)["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeSelector"]["zone"] == "a" and spec["priorityClassName"] == "high"
        assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
        assert spec["affinity"] == AFFINITY  # as written: camelCase, no defaults or nulls added
        assert spec["serviceAccountName"] == "job-a-runtime"
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert env["X"]["value"] == "1"
        # The hub token is a file, never an environment variable.
        assert "HF_TOKEN" not in env and env["HF_TOKEN_PATH"]["value"] == HF_TOKEN_PATH
        token = next(v for v in spec["volumes"] if v["name"] == "hf-token")
        assert token["secret"] == {
            "secretName": "hf",
            "items": [{"key": "token", "path": "token"}],
            "defaultMode": 0o400,
            "optional": False,
        }
        mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts[HF_TOKEN_PATH.rsplit("/", 1)[0]] == {
            "name": "hf-token",
            "mountPath": "/var/run/secrets/rljob/huggingface",
            "readOnly": True,
        }
        assert pod["metadata"]["labels"]["rljob.dev/job"] == "job-a"


def test_runtime_may_only_touch_its_own_job_status() -> None:
    account, role, binding = build_runtime_rbac(job_from_spec())
    assert account["kind"] == "ServiceAccount" and account["metadata"]["name"] == "job-a-runtime"
    status_rule = role["rules"][0]
    assert status_rule["resources"] == ["rltrainingjobs/status"]
    assert status_rule["resourceNames"] == ["job-a"] and status_rule["verbs"] == ["get", "patch"]
    # events: create only (a trainer restart is announced on the job); nothing else in the namespace
    assert role["rules"][2] == {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    assert len(role["rules"]) == 3
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "job-a-runtime", "namespace": "ml"}]
    assert build_runtime_rbac(job_from_spec({"resources": {"serviceAccountName": "mine"}})) == []


def test_no_custom_ray_resource_is_read_as_a_gpu_by_kuberay() -> None:
    """KubeRay (utils.IsGPUResourceKey) turns a group resource ending with "gpu" into num-gpus, and the
    placement groups asking for it would never be placed (seen on a real node with "rljob_gpu")."""
    from rljob_api.contract import RAY_RESOURCE_COLOCATED, RAY_RESOURCE_ROLLOUT, RAY_RESOURCE_TRAINER

    for name in (RAY_RESOURCE_COLOCATED, RAY_RESOURCE_TRAINER, RAY_RESOURCE_ROLLOUT):
        assert not name.lower().endswith("gpu") and not re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", name), name
