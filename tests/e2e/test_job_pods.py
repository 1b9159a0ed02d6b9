"""The job's pods on the real API server and the real KubeRay: they carry the declared volumes, pass
the `restricted` Pod Security Standard, get Ray's token auth, sit behind a NetworkPolicy; hostPath is
the admin's call; and a real training run reads its model and data from the declared volume.

kwok pods run no containers: the RayJob's entrypoint runs on the local Ray, which sees this
machine's files. So the training test mounts a hostPath volume at the same path as the directory
on this machine: the pods declare it, the local Ray (standing in for them) reads it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_process import OperatorProcess
from test_operator import H100, _in, condition, in_phase, job, status, tiny_training_job, wait_for

pytestmark = pytest.mark.e2e

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
HOST_PATH_PREFIX = "/tmp"


@pytest.fixture(scope="module")
def operator(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        crd.kubeconfig,
        tmp_path_factory.mktemp("operator"),
        args=("--secret-preflight", f"--allow-host-path={HOST_PATH_PREFIX}"),
    )
    proc.start()
    yield proc
    proc.stop()


def _restrict(crd: Any, namespace: str) -> None:
    crd.kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))


def _objects(namespace: str) -> list[dict[str, Any]]:
    meta = {"namespace": namespace}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, **meta},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        for claim in ("models", "hf-cache")
    ] + [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "hooks", **meta},
            "data": {"reward.py": "x = 1"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", **meta},
            "stringData": {"token": "hf_x"},
        },
    ]


VOLUMES = [
    {
        "name": "models",
        "mountPath": "/shared/models",
        "readOnly": True,
        "persistentVolumeClaim": {"claimName": "models"},
    },
    {"name": "hooks", "mountPath": "/hooks", "configMap": {"name": "hooks"}},
    {"name": "scratch", "mountPath": "/scratch", "emptyDir": {"sizeLimit": "1Gi"}},
]


def _pods(crd: Any, namespace: str, name: str, count: int) -> Any:
    def check() -> list[dict[str, Any]] | None:
        pods = crd.list("pods", namespace, f"rljob.dev/job={name}")
        return pods if len(pods) >= count else None

    return check


def test_pods_carry_the_volumes_pass_restricted_and_get_ray_auth(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    _restrict(crd, namespace)
    crd.apply(*_objects(namespace))
    patch = {
        # torch: a megatron job with a model cache would convert its model first (test_conversion_jobs.py)
        "training": {"backend": "torch"},
        "resources": {
            **H100,
            "volumes": VOLUMES,
            "modelCache": {"claimName": "hf-cache"},
            "secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}},
            "labels": {"team": "rl"},
            "trainer": {"annotations": {"example.com/owner": "me"}},
        },
    }
    crd.apply(_in(namespace, job("mounts", patch)))
    pods = wait_for("the head and the GPU pod", _pods(crd, namespace, "mounts", 2), operator)
    for pod in pods:  # admitted by the restricted standard, as KubeRay created them
        mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        for path, name in {
            "/shared/models": "models",
            "/hooks": "hooks",
            "/scratch": "scratch",
            "/var/cache/rljob": "model-cache",
            "/var/run/secrets/rljob/huggingface": "hf-token",
        }.items():
            assert mounts.get(path) == name, mounts
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "hf-cache"
        assert pod["metadata"]["labels"]["team"] == "rl"
        env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
        assert "RAY_AUTH_TOKEN" in env and "HF_TOKEN" not in env  # KubeRay's token; the hub token is a file
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    gpu = next(p for p in pods if p["metadata"]["labels"]["rljob.dev/role"] == "gpu")
    assert gpu["metadata"]["annotations"]["example.com/owner"] == "me"
    rayjob = crd.get("rayjob", "mounts", namespace)
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    policy = crd.get("networkpolicy", "mounts-ray", namespace)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"rljob.dev/job": "mounts"}
    assert policy["metadata"]["ownerReferences"][0]["name"] == "mounts"


def test_the_restricted_standard_refuses_a_host_path_pod(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    """The control for the test above: the namespace really enforces `restricted` (hostPath is not
    allowed there), so pods that pass were checked."""
    _restrict(crd, namespace)
    patch = {
        "resources": {
            **H100,
            "volumes": [{"name": "nvme", "mountPath": "/nvme", "hostPath": {"path": "/tmp/nvme"}}],
        }
    }
    crd.apply(_in(namespace, job("hostpath", patch)))

    def refused() -> str | None:
        messages = [e.get("message", "") for e in crd.list("events", namespace)]
        return next((m for m in messages if "violates PodSecurity" in m), None)

    message = wait_for("a PodSecurity refusal", refused, operator)
    assert "hostPath" in message or "restricted" in message
    assert crd.list("pods", namespace, "rljob.dev/job=hostpath") == []

    def named() -> dict[str, Any] | None:  # the job's status names the field the refused volume came from
        ready = condition(status(crd, namespace, "hostpath"), "Ready")
        return ready if ready.get("reason") == "PodCreationRefused" else None

    ready = wait_for("the job's PodCreationRefused reason", named, operator, timeout=60)
    assert "It comes from spec.resources.volumes[0] (nvme) of this job" in ready["message"], ready


def test_host_paths_outside_the_admins_prefixes_are_refused_before_anything_is_created(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    patch = {
        "resources": {
            **H100,
            "volumes": [{"name": "etc", "mountPath": "/host-etc", "hostPath": {"path": "/etc"}}],
        }
    }
    crd.apply(_in(namespace, job("etc", patch)))
    st = wait_for(
        "the HostPathNotAllowed reason",
        lambda: (
            (s := status(crd, namespace, "etc"))
            and condition(s, "Ready").get("reason") == "HostPathNotAllowed"
            and s
        ),
        operator,
    )
    assert "'/etc' (spec.resources.volumes[0], etc)" in condition(st, "Ready")["message"]
    assert f"only paths below {HOST_PATH_PREFIX}" in condition(st, "Ready")["message"]
    assert crd.get("rayjob", "etc", namespace) is None


def test_a_job_trains_on_the_model_and_data_of_its_declared_volume(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"  # below /tmp: the operator above allows it
    built = tiny_training_job(tmp_path / "build", "from-volume", namespace, num_rollout=1)
    shutil.copytree(built["spec"]["model"]["path"], shared / "models" / "tiny")
    (shared / "data").mkdir()
    shutil.copy(built["spec"]["data"]["path"], shared / "data" / "prompts.jsonl")
    spec = built["spec"]
    spec["model"]["path"] = str(shared / "models" / "tiny")
    spec["data"]["path"] = str(shared / "data" / "prompts.jsonl")
    spec["resources"]["volumes"] = [
        {"name": "shared", "mountPath": str(shared), "readOnly": True, "hostPath": {"path": str(shared)}}
    ]
    spec["checkpoint"]["path"] = str(tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "build")  # nothing else to read the model from
    crd.apply(built)
    st = wait_for(
        "the job to finish",
        in_phase(crd, namespace, "from-volume", "Succeeded", "Failed"),
        operator,
        timeout=420,
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    rayjob = crd.get("rayjob", "from-volume", namespace)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "shared", "hostPath": {"path": str(shared), "type": "Directory"}} in head["volumes"]
