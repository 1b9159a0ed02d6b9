"""What users may add to the job's pods without a fork: labels, annotations, environment, and the
user and group the containers run as. Validated as pod validation would, so a bad value is refused
when the job is applied, not when KubeRay creates the pods."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from .base import QUALIFIED_NAME_PATTERN, ApiModel, LabelKey, LabelValue
from .rules import Rule

# Set by the operator (the job's identity, caches, token) or by KubeRay (Ray's addresses and auth):
# a user value would be ignored or would break the cluster. Every RLJOB_ name is the operator's.
OPERATOR_ENV_PREFIX = "RLJOB_"
# RAY_JOB_STOP_WAIT_TIME_S is faultTolerance.terminationGracePeriodSeconds in the Ray job's environment.
OPERATOR_ENV = ("HF_HOME", "HF_TOKEN_PATH", "RAY_JOB_STOP_WAIT_TIME_S")
KUBERAY_ENV = (
    "RAY_ADDRESS",
    "RAY_IP",
    "FQ_RAY_IP",
    "RAY_PORT",
    "RAY_CLUSTER_NAME",
    "RAY_CLUSTER_NAMESPACE",
    "RAY_NODE_TYPE_NAME",
    "RAY_CLOUD_INSTANCE_ID",
    "RAY_HEAD_POD_NAME",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "KUBERAY_GEN_RAY_START_CMD",
    "KUBERAY_CRD_VER",
)
# Which GPUs a process sees: the device plugin sets them for the GPUs the pod was given, and Ray
# for each of its workers. A user value would put processes on GPUs placement did not give them
# (or, with some container runtimes, on every GPU of the node).
PLACEMENT_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
)
RESERVED_ENV = OPERATOR_ENV + KUBERAY_ENV + PLACEMENT_ENV


def reserved_env(name: str) -> bool:
    """Whether `env` may not set the variable `name`."""
    return name.startswith(OPERATOR_ENV_PREFIX) or name in RESERVED_ENV


# Label prefixes the operator and KubeRay select pods by.
RESERVED_LABEL_PREFIXES = ("rljob.dev/", "ray.io/")

AnnotationKey = LabelKey
# Pod validation caps a pod's annotations at 256 KiB in all; up to three maps of 32 reach a pod.
AnnotationValue = Annotated[str, Field(max_length=2048)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=32)]
Annotations = Annotated[dict[AnnotationKey, AnnotationValue], Field(max_length=32)]


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def qualified_keys_rule(name: str, attr: str) -> Rule:
    """The keys of map field `name` (python `attr`) are qualified names, as pod validation wants
    for labels, annotations and node selectors."""
    pattern = QUALIFIED_NAME_PATTERN.replace("\\", "\\\\")
    return Rule(
        cel=f"!has(self.{name}) || self.{name}.all(k, k.matches('{pattern}'))",
        message=f"{name}: keys must be qualified names: an optional DNS subdomain and '/', then at most 63 "
        "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit",
        field=f".{name}",
        # fullmatch: RE2's '$' is the end of the text, where Python's also matches before a final newline
        check=lambda o: all(re.fullmatch(QUALIFIED_NAME_PATTERN, k) for k in getattr(o, attr)),
    )


def reserved_env_rule(field: str = ".env") -> Rule:
    """`env` may not set a variable the operator or KubeRay sets, nor one that decides the GPUs."""
    return Rule(
        cel=f"!has(self.env) || !self.env.exists(e, e.name.startsWith('{OPERATOR_ENV_PREFIX}') || "
        f"e.name in {_cel_list(RESERVED_ENV)})",
        message=f"env may not set a variable the operator or KubeRay sets itself ({OPERATOR_ENV_PREFIX}*, "
        + ", ".join(OPERATOR_ENV + KUBERAY_ENV)
        + ") or one that decides which GPUs a process sees ("
        + ", ".join(PLACEMENT_ENV)
        + ": the device plugin and Ray set them from the job's placement); use resources.secrets and "
        "resources.modelCache for tokens and caches, and resources.trainer and resources.rollout for GPUs",
        field=field,
        check=lambda o: not any(reserved_env(e.name) for e in o.env),
    )


def reserved_labels_rule() -> Rule:
    return Rule(
        cel="!has(self.labels) || !self.labels.exists(k, "
        + " || ".join(f"k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES)
        + ")",
        message="labels may not use the prefixes the operator and KubeRay select pods by ("
        + ", ".join(RESERVED_LABEL_PREFIXES)
        + ")",
        field=".labels",
        check=lambda o: not any(k.startswith(RESERVED_LABEL_PREFIXES) for k in o.labels),
    )


class PodSecurity(ApiModel):
    """The user and group of the job's containers. Pods always run as non-root, without privilege
    escalation, with every capability dropped and the RuntimeDefault seccomp profile (Pod Security
    Standard `restricted`); the operator's admin may add capabilities GPU pods need."""

    run_as_user: int = Field(
        default=65532,
        ge=1,
        le=2147483647,
        description="UID of the containers (the runtime image's user is 65532; rayproject/ray images use 1000).",
    )
    run_as_group: int = Field(default=65532, ge=0, le=2147483647, description="GID of the containers.")
    fs_group: int | None = Field(
        default=65532,
        ge=0,
        le=2147483647,
        description="Group that owns mounted volumes, so the non-root user can write checkpoints and caches.",
    )
    read_only_root_filesystem: bool = Field(
        default=True,
        description="Run the containers on a read-only root filesystem; /tmp and HOME (/home/rljob) are "
        "then emptyDirs. false: the image's own directories stay writable.",
    )
