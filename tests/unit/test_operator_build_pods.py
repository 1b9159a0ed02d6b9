"""What reaches the job's pods: volumes, the model cache, the token file, security, labels and env,
the NetworkPolicy and Ray's token auth; and the pre-flight policy for claims and hostPath."""

from __future__ import annotations

from typing import Any

import pytest
from operator_fixtures import job_from_spec

from rljob_api.pod_paths import HF_HOME, HOME_PATH, HOME_VOLUME, MODEL_CACHE_PATH, TMP_PATH, TMP_VOLUME
from rljob_operator.build import BuildSettings, build_prerequisites, build_rayjob
from rljob_operator.checks import check_children_fit, check_host_paths, check_references

VOLUMES = [
    {
        "name": "models",
        "mountPath": "/shared/models",
        "readOnly": True,
        "persistentVolumeClaim": {"claimName": "m"},
    },
    {
        "name": "data",
        "mountPath": "/shared/data",
        "subPath": "math",
        "persistentVolumeClaim": {"claimName": "d"},
    },
    {
        "name": "hooks",
        "mountPath": "/hooks",
        "configMap": {"name": "h", "items": [{"key": "a.py", "path": "a.py"}]},
    },
    {"name": "keys", "mountPath": "/keys", "secret": {"secretName": "k"}},
    {"name": "nvme", "mountPath": "/nvme", "hostPath": {"path": "/mnt/nvme", "type": "DirectoryOrCreate"}},
    {"name": "scratch", "mountPath": "/scratch", "emptyDir": {"sizeLimit": "100Gi"}},
]
DISAGGREGATED = {"resources": {"colocate": False, "rollout": {"gpus": 8}}}


def _pods(patch: dict[str, Any], settings: BuildSettings | None = None) -> list[dict[str, Any]]:
    cluster = build_rayjob(job_from_spec(patch), settings or BuildSettings(), suspend=False)["spec"][
        "rayClusterSpec"
    ]
    return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]


def _merge(*patches: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for patch in patches:
        for key, value in patch.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("mode", [{}, DISAGGREGATED], ids=["colocated", "disaggregated"])
def test_every_pod_mounts_every_volume_at_its_path(mode: dict[str, Any]) -> None:
    pods = _pods(_merge(mode, {"resources": {"volumes": VOLUMES}}))
    assert len(pods) == (2 if not mode else 3)
    for pod in pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "m", "readOnly": True}
        assert mounts["models"] == {"name": "models", "mountPath": "/shared/models", "readOnly": True}
        assert mounts["data"] == {"name": "data", "mountPath": "/shared/data", "subPath": "math"}
        assert volumes["hooks"]["configMap"] == {
            "name": "h",
            "items": [{"key": "a.py", "path": "a.py"}],
            "optional": False,
        }
        assert volumes["keys"]["secret"] == {"secretName": "k", "optional": False, "defaultMode": 0o400}
        assert volumes["nvme"]["hostPath"] == {"path": "/mnt/nvme", "type": "DirectoryOrCreate"}
        assert volumes["scratch"]["emptyDir"] == {"medium": "", "sizeLimit": "100Gi"}
        paths = [m["mountPath"] for m in mounts.values()]
        assert len(paths) == len(set(paths))


def test_model_cache_is_the_shared_claim_or_a_scratch_dir_and_hub_downloads_go_there() -> None:
    for patch, source in (
        ({"resources": {"modelCache": {"claimName": "hf-cache", "subPath": "hub"}}}, "persistentVolumeClaim"),
        ({}, "emptyDir"),
    ):
        for pod in _pods(patch):
            cache = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
            assert source in cache
            mount = next(
                m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "model-cache"
            )
            assert mount["mountPath"] == MODEL_CACHE_PATH
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["HF_HOME"] == HF_HOME and env["HF_HOME"].startswith(MODEL_CACHE_PATH + "/")
    shared = _pods({"resources": {"modelCache": {"claimName": "hf-cache", "subPath": "hub"}}})[0]
    assert next(v for v in shared["spec"]["volumes"] if v["name"] == "model-cache")[
        "persistentVolumeClaim"
    ] == {"claimName": "hf-cache"}


def test_pods_pass_the_restricted_pod_security_standard_unless_the_admin_adds_capabilities() -> None:
    for pod in _pods(DISAGGREGATED):
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        container = spec["containers"][0]["securityContext"]
        assert container == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        }
    pods = _pods(DISAGGREGATED, BuildSettings(gpu_capabilities=("IPC_LOCK",)))
    caps = {
        p["metadata"]["labels"]["rljob.dev/role"]: p["spec"]["containers"][0]["securityContext"][
            "capabilities"
        ]
        for p in pods
    }
    assert caps["head"] == {"drop": ["ALL"]}  # no GPU, no extra capability
    assert caps["trainer"] == caps["rollout"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    # device cpu: no GPU container, so no capability either
    cpu = _pods(
        {"resources": {"device": "cpu"}, "rollout": {"engine": "hf"}, "training": {"backend": "torch"}},
        BuildSettings(gpu_capabilities=("IPC_LOCK",)),
    )
    assert all("add" not in p["spec"]["containers"][0]["securityContext"]["capabilities"] for p in cpu)


def _mounts(pod: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}


def test_a_read_only_root_filesystem_leaves_tmp_and_home_writable_on_empty_dirs() -> None:
    for pod in _pods(DISAGGREGATED):
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = _mounts(pod)
        assert mounts[TMP_PATH] == TMP_VOLUME and mounts[HOME_PATH] == HOME_VOLUME
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes[TMP_VOLUME] == {"name": TMP_VOLUME, "emptyDir": {}}
        assert volumes[HOME_VOLUME] == {"name": HOME_VOLUME, "emptyDir": {}}
        assert {"name": "HOME", "value": HOME_PATH} in container["env"]
        # /tmp first: a volume below it (a checkpoint path under /tmp) is mounted on top, not hidden
        assert container["volumeMounts"][0]["mountPath"] == TMP_PATH
    # A job volume at exactly /tmp takes the place of the emptyDir; the user's HOME wins over ours.
    own = _pods(
        {
            "resources": {
                "volumes": [{"name": "scratch", "mountPath": "/tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                "env": [{"name": "HOME", "value": "/tmp"}],
            }
        }
    )[0]
    assert _mounts(own)["/tmp"] == "scratch" and TMP_VOLUME not in {v["name"] for v in own["spec"]["volumes"]}
    assert [e["value"] for e in own["spec"]["containers"][0]["env"] if e["name"] == "HOME"] == ["/tmp"]
    # readOnlyRootFilesystem: false leaves the image as it is: no scratch volumes, no HOME.
    writable = _pods({"resources": {"securityContext": {"readOnlyRootFilesystem": False}}})[0]
    container = writable["spec"]["containers"][0]
    assert "readOnlyRootFilesystem" not in container["securityContext"]
    assert TMP_PATH not in _mounts(writable) and HOME_PATH not in _mounts(writable)
    assert "HOME" not in {e["name"] for e in container["env"]}


def test_the_user_and_group_come_from_the_spec() -> None:
    pod = _pods({"resources": {"securityContext": {"runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100}}})[0]
    assert pod["spec"]["securityContext"] | {} == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 100,
        "fsGroup": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_labels_annotations_env_and_tolerations_per_group() -> None:
    patch = _merge(
        DISAGGREGATED,
        {
            "resources": {
                "colocate": False,
                "rollout": {"gpus": 8, "labels": {"tier": "gen"}, "env": [{"name": "X", "value": "rollout"}]},
                "labels": {"team": "rl", "tier": "all"},
                "annotations": {"example.com/cost-center": "42"},
                "env": [{"name": "X", "value": "all"}, {"name": "Y", "value": "1"}],
                "head": {
                    "annotations": {"example.com/scrape": "true"},
                    "tolerations": [{"key": "cpu-only", "operator": "Exists"}],
                },
                "trainer": {"labels": {"tier": "train"}},
            }
        },
    )
    pods = {p["metadata"]["labels"]["rljob.dev/role"]: p for p in _pods(patch)}
    assert {r: p["metadata"]["labels"]["tier"] for r, p in pods.items()} == {
        "head": "all",
        "trainer": "train",
        "rollout": "gen",
    }
    assert all(
        p["metadata"]["labels"]["team"] == "rl" and p["metadata"]["labels"]["rljob.dev/job"] == "job-a"
        for p in pods.values()
    )
    assert pods["head"]["metadata"]["annotations"] == {
        "example.com/cost-center": "42",
        "example.com/scrape": "true",
    }
    assert pods["trainer"]["metadata"]["annotations"] == {"example.com/cost-center": "42"}
    env = {
        r: [(e["name"], e.get("value")) for e in p["spec"]["containers"][0]["env"] if e["name"] in "XY"]
        for r, p in pods.items()
    }
    assert env["rollout"] == [("X", "rollout"), ("Y", "1")]  # the group's value replaces the job-wide one
    assert env["trainer"] == env["head"] == [("X", "all"), ("Y", "1")]
    assert pods["head"]["spec"]["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]
    assert "tolerations" not in pods["trainer"]["spec"]


def test_colocated_pods_get_both_the_trainer_and_the_rollout_additions() -> None:
    patch = {"resources": {"trainer": {"labels": {"a": "1"}}, "rollout": {"labels": {"b": "2"}}}}
    gpu = _pods(patch)[1]
    assert gpu["metadata"]["labels"]["a"] == "1" and gpu["metadata"]["labels"]["b"] == "2"


def test_network_policy_admits_only_the_jobs_pods_and_kuberay() -> None:
    job = job_from_spec()
    children = build_prerequisites(job, BuildSettings(kuberay_namespace="ray-system"))
    policy = children[-1]
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["ownerReferences"][0]["uid"] == job.uid
    assert policy["spec"]["podSelector"] == {"matchLabels": {"rljob.dev/job": "job-a"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers = policy["spec"]["ingress"][0]["from"]
    assert peers[0] == {"podSelector": {"matchLabels": {"rljob.dev/job": "job-a"}}}
    assert peers[1]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}
    assert "NetworkPolicy" not in [
        c["kind"] for c in build_prerequisites(job, BuildSettings(network_policy=False))
    ]


def test_ray_token_auth_is_on_unless_the_admin_turns_it_off() -> None:
    job = job_from_spec()
    on = build_rayjob(job, BuildSettings(), suspend=False)["spec"]["rayClusterSpec"]
    off = build_rayjob(job, BuildSettings(ray_auth=False), suspend=False)["spec"]["rayClusterSpec"]
    assert on["authOptions"] == {"mode": "token"} and "authOptions" not in off


def test_host_paths_need_the_admins_permission() -> None:
    job = job_from_spec({"resources": {"volumes": VOLUMES}})
    refused = check_host_paths(job, ())
    assert refused is not None and refused.reason == "HostPathNotAllowed"
    assert (
        "'/mnt/nvme' (spec.resources.volumes[4], nvme)" in refused.message
        and "no hostPath volumes" in refused.message
    )
    assert check_host_paths(job, ("/mnt",)) is None
    assert check_host_paths(job, ("/mnt/nvme",)) is None
    assert check_host_paths(job, ("/mnt/nv",)) is not None  # a prefix of the name is not a parent directory


def test_every_claim_and_secret_a_pod_mounts_must_exist() -> None:
    job = job_from_spec(
        {
            "resources": {"volumes": VOLUMES, "modelCache": {"claimName": "cache"}},
            "checkpoint": {"volume": {"claimName": "ckpt"}},
        }
    )
    missing = check_references(job, {"k"}, {"m", "ckpt"})
    assert missing is not None and missing.reason == "VolumeNotFound"
    assert "'cache' (spec.resources.modelCache.claimName)" in missing.message
    assert "'d' (spec.resources.volumes[1] (data))" in missing.message
    missing = check_references(job, set(), {"m", "d", "ckpt", "cache"})
    assert (
        missing is not None
        and missing.reason == "SecretNotFound"
        and "resources.volumes[3] (keys)" in missing.message
    )
    assert check_references(job, {"k"}, {"m", "d", "ckpt", "cache"}) is None
    assert check_references(job, None, {"m", "d", "ckpt", "cache"}) is None  # may not read Secrets


def test_children_too_large_for_the_api_server_are_refused_before_creation() -> None:
    big = [{"name": f"V{i}", "value": "x" * 30000} for i in range(40)]
    job = job_from_spec({"resources": {"env": big}})
    blocker = check_children_fit(job, build_rayjob(job, BuildSettings(), suspend=None))
    assert blocker is not None and blocker.reason == "SpecTooLarge" and blocker.terminal
    assert "resources.env" in blocker.message
    assert (
        check_children_fit(job_from_spec(), build_rayjob(job_from_spec(), BuildSettings(), suspend=None))
        is None
    )


def test_a_cpu_jobs_ray_workers_run_at_normal_priority_unless_the_user_says() -> None:
    """Ray niceness 15 made the CPU demo's trainer threads wait behind the node's other processes."""

    def niceness(patch: dict[str, Any]) -> set[str | None]:
        return {
            next(
                (
                    e.get("value")
                    for e in p["spec"]["containers"][0]["env"]
                    if e["name"] == "RAY_worker_niceness"
                ),
                None,
            )
            for p in _pods(patch)
        }

    cpu = {"resources": {"device": "cpu"}, "rollout": {"engine": "hf"}, "training": {"backend": "torch"}}
    assert niceness(cpu) == {"0"}  # head and worker pods
    assert niceness({}) == {None}  # GPU jobs: Ray's default
    mine = _merge(cpu, {"resources": {"env": [{"name": "RAY_worker_niceness", "value": "10"}]}})
    assert niceness(mine) == {"10"}
