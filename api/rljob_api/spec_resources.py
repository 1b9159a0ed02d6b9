"""Where and on what the job runs: GPUs, pods, placement, image, environment and secrets."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from .base import (
    ENV_NAME_PATTERN,
    IMAGE_PATTERN,
    ApiModel,
    LabelKey,
    LabelValue,
    Name,
    QualifiedName,
    Quantity,
    section,
)
from .extended_resource import EXTENDED_RESOURCE_MAX, GPU_RESOURCE_RULE
from .images import RUNTIME_IMAGE
from .paths import path_rules
from .rules import Rule, immutable
from .spec_affinity import Affinity
from .spec_pods import (
    Annotations,
    Labels,
    PodSecurity,
    qualified_keys_rule,
    reserved_env_rule,
    reserved_labels_rule,
)
from .spec_volumes import VOLUME_LIST_RULES, SubPath, Volumes

_GANG = "the GPU gang is fixed for the life of the job; create a new job to resize it"

NodeSelector = Annotated[dict[LabelKey, LabelValue], Field(max_length=32)]


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    rules = (
        Rule(
            cel="self.operator != 'Exists' || !has(self.value)",
            message="value must be empty when operator is Exists",
            field=".value",
            check=lambda t: t.operator != "Exists" or t.value is None,
        ),
        Rule(
            cel="has(self.key) || self.operator == 'Exists'",
            message="operator must be Exists when key is empty (which matches every taint)",
            field=".operator",
            check=lambda t: t.key is not None or t.operator == "Exists",
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds needs effect NoExecute",
            field=".tolerationSeconds",
            check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
    )

    key: QualifiedName | None = Field(
        default=None, description="Taint key; empty with operator Exists matches all."
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: LabelValue | None = Field(default=None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


Tolerations = Annotated[list[Toleration], Field(max_length=32)]


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the job's namespace."""

    name: Name = Field(description="Name of the Secret or ConfigMap.")
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Key inside it.")
    optional: bool = Field(default=False, description="Start even if it does not exist.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from."""

    rules = (
        Rule(
            cel="has(self.secretKeyRef) != has(self.configMapKeyRef)",
            message="set exactly one of secretKeyRef and configMapKeyRef",
            field=".secretKeyRef",
            check=lambda v: (v.secret_key_ref is None) != (v.config_map_key_ref is None),
        ),
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")


class EnvVar(ApiModel):
    """An environment variable for the runtime containers."""

    rules = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            field=".valueFrom",
            check=lambda e: e.value is None or e.value_from is None,
        ),
    )

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)] = Field(
        description="Variable name."
    )
    value: Annotated[str, Field(max_length=32768)] | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(default=None, description="Value from a Secret or ConfigMap key.")


class SecretsSpec(ApiModel):
    """Credentials the runtime needs, as references to Secrets in the job's namespace."""

    hugging_face_token: KeySelector | None = Field(
        default=None,
        description="Hugging Face token for gated models: mounted as a file (HF_TOKEN_PATH), never an "
        "environment variable.",
    )
    wandb_api_key: KeySelector | None = Field(
        default=None, description="Exposed as WANDB_API_KEY: metrics to Weights & Biases."
    )


class PodResources(ApiModel):
    """CPU and memory of one group of pods, and what users add to them."""

    rules: ClassVar[tuple[Rule, ...]] = (
        reserved_env_rule(),
        reserved_labels_rule(),
        qualified_keys_rule("labels", "labels"),
        qualified_keys_rule("annotations", "annotations"),
    )

    cpu: Quantity | None = Field(default=None, description="CPU request and limit, e.g. 8 or '500m'.")
    memory: Quantity | None = Field(default=None, description="Memory request and limit, e.g. '64Gi'.")
    labels: Labels = Field(
        default_factory=dict,
        description="Labels of these pods (over resources.labels), e.g. for cost reports.",
    )
    annotations: Annotations = Field(
        default_factory=dict,
        description="Annotations of these pods (over resources.annotations), e.g. for a sidecar injector.",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Environment of these pods (after resources.env)."
    )


class ModelCacheSpec(ApiModel):
    """The shared model cache volume."""

    rules = path_rules(
        "subPath", "sub_path", form="relative", label="modelCache.subPath", example="cache", optional=True
    )

    claim_name: Name = Field(description="PersistentVolumeClaim (ReadWriteMany for jobs of several pods).")
    sub_path: SubPath | None = Field(
        default=None, description="Directory of the claim to use: a relative path, without '..'."
    )


class HeadSpec(PodResources):
    """The Ray head pod (no GPUs; runs the driver, the router and the data source)."""

    cpu: Quantity | None = Field(default="2", description="CPU of the head pod.")
    memory: Quantity | None = Field(default="8Gi", description="Memory of the head pod.")
    tolerations: Tolerations = Field(
        default_factory=list,
        description="Extra tolerations for the head pod (added to resources.tolerations).",
    )


class TrainerResources(PodResources):
    """Trainer GPUs: nodes x gpusPerNode, one trainer process per GPU."""

    rules = (
        *PodResources.rules,
        qualified_keys_rule("nodeSelector", "node_selector"),
        immutable("nodes", "nodes", hint=_GANG),
        immutable("gpusPerNode", "gpus_per_node", hint=_GANG),
    )

    nodes: int = Field(default=1, ge=1, le=1024, description="Trainer pods (one per node).")
    gpus_per_node: int = Field(
        default=8,
        ge=1,
        le=16,
        description="GPUs per trainer pod. With device cpu: trainer processes per pod.",
    )
    node_selector: NodeSelector = Field(
        default_factory=dict,
        description="Extra node labels for trainer pods (merged over resources.nodeSelector).",
    )
    tolerations: Tolerations = Field(
        default_factory=list,
        description="Extra tolerations for trainer pods (added to resources.tolerations).",
    )


class RolloutResources(PodResources):
    """Rollout GPUs: the SGLang engines."""

    rules = (
        *PodResources.rules,
        qualified_keys_rule("nodeSelector", "node_selector"),
        immutable("gpus", "gpus", optional=True, hint=_GANG),
        immutable("gpusPerEngine", "gpus_per_engine", hint=_GANG),
    )

    gpus: int | None = Field(
        default=None,
        ge=1,
        le=16384,
        description="GPUs for rollout engines. Colocated: defaults to (and must equal) the trainer GPUs. "
        "Disaggregated: required; engines get their own pods.",
    )
    gpus_per_engine: int = Field(
        default=1, ge=1, le=64, description="GPUs per engine (SGLang tensor parallelism); must divide gpus."
    )
    gpus_per_node: int = Field(
        default=8,
        ge=1,
        le=16,
        description="Disaggregated only: GPUs per rollout pod; rollout.gpus must be at most this or a "
        "multiple of it (pods = gpus / gpusPerNode).",
    )
    node_selector: NodeSelector = Field(
        default_factory=dict,
        description="Extra node labels for rollout pods (merged over resources.nodeSelector).",
    )
    tolerations: Tolerations = Field(
        default_factory=list,
        description="Extra tolerations for rollout pods (added to resources.tolerations).",
    )


_ROLLOUT_GPUS_CEL = (
    "(has(self.rollout.gpus) ? self.rollout.gpus : self.trainer.nodes * self.trainer.gpusPerNode)"
)


_ENGINE_POD_GPUS_CEL = (
    "(self.colocate ? self.trainer.gpusPerNode : "
    "(has(self.rollout.gpus) && self.rollout.gpus < self.rollout.gpusPerNode ? self.rollout.gpus "
    ": self.rollout.gpusPerNode))"
)


def engine_pod_gpus(resources: ResourcesSpec) -> int:
    """GPUs of one pod that hosts engines: a trainer pod when colocated, else a rollout pod."""
    if resources.colocate:
        return resources.trainer.gpus_per_node
    return min(rollout_gpus(resources), resources.rollout.gpus_per_node)


def rollout_pods(resources: ResourcesSpec) -> int:
    """Rollout pods when disaggregated (all alike: see the rule on rollout.gpus)."""
    return max(1, rollout_gpus(resources) // resources.rollout.gpus_per_node)


def rollout_gpus(resources: ResourcesSpec) -> int:
    """Rollout GPUs: rollout.gpus, or the trainer GPUs when colocated and unset."""
    if resources.rollout.gpus is not None:
        return resources.rollout.gpus
    return resources.trainer.nodes * resources.trainer.gpus_per_node


class ResourcesSpec(ApiModel):
    """Pods, GPUs and placement."""

    rules = (
        Rule(
            cel="self.colocate || has(self.rollout.gpus)",
            message="rollout.gpus is required when colocate is false: the engines get GPUs of their own",
            field=".rollout.gpus",
            check=lambda r: r.colocate or r.rollout.gpus is not None,
        ),
        Rule(
            cel="!self.colocate || !has(self.rollout.gpus) || "
            "self.rollout.gpus == self.trainer.nodes * self.trainer.gpusPerNode",
            message="with colocate true, rollout.gpus must equal the trainer GPUs, trainer.nodes * "
            "trainer.gpusPerNode (leave rollout.gpus unset to use them)",
            field=".rollout.gpus",
            check=lambda r: (
                not r.colocate
                or r.rollout.gpus is None
                or r.rollout.gpus == r.trainer.nodes * r.trainer.gpus_per_node
            ),
        ),
        Rule(
            cel=f"{_ROLLOUT_GPUS_CEL} % self.rollout.gpusPerEngine == 0",
            message="rollout.gpusPerEngine must divide the rollout GPUs",
            field=".rollout.gpusPerEngine",
            check=lambda r: rollout_gpus(r) % r.rollout.gpus_per_engine == 0,
        ),
        Rule(
            cel="self.colocate || !has(self.rollout.gpus) || self.rollout.gpus <= self.rollout.gpusPerNode"
            " || self.rollout.gpus % self.rollout.gpusPerNode == 0",
            message="rollout.gpus must be at most rollout.gpusPerNode or a multiple of it: all rollout pods "
            "are alike",
            field=".rollout.gpus",
            check=lambda r: (
                r.colocate
                or r.rollout.gpus is None
                or r.rollout.gpus <= r.rollout.gpus_per_node
                or r.rollout.gpus % r.rollout.gpus_per_node == 0
            ),
        ),
        Rule(
            # Checked once the engines divide the rollout GPUs (the rule above reports that case).
            cel=f"{_ROLLOUT_GPUS_CEL} % self.rollout.gpusPerEngine != 0 || "
            f"{_ENGINE_POD_GPUS_CEL} % self.rollout.gpusPerEngine == 0",
            message="rollout.gpusPerEngine must divide the GPUs of one pod (trainer.gpusPerNode when "
            "colocated, else rollout.gpusPerNode or rollout.gpus if smaller): an engine cannot span pods",
            field=".rollout.gpusPerEngine",
            check=lambda r: (
                rollout_gpus(r) % r.rollout.gpus_per_engine != 0
                or engine_pod_gpus(r) % r.rollout.gpus_per_engine == 0
            ),
        ),
        GPU_RESOURCE_RULE,
        immutable("device", "device", hint=_GANG),
        immutable("colocate", "colocate", hint=_GANG),
        reserved_env_rule(),
        reserved_labels_rule(),
        qualified_keys_rule("labels", "labels"),
        qualified_keys_rule("annotations", "annotations"),
        qualified_keys_rule("nodeSelector", "node_selector"),
        *VOLUME_LIST_RULES,
    )

    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="cuda: pods request GPUs (gpuResourceName); cpu: no GPUs, each 'GPU' below is one CPU "
        "process slot (needs rollout.engine hf and training.backend torch).",
    )
    gpu_resource_name: Annotated[str, Field(min_length=1, max_length=EXTENDED_RESOURCE_MAX)] = Field(
        default="nvidia.com/gpu",
        description="Extended resource that pods request for GPUs, <domain>/<name> as the device plugin "
        "advertises it (nvidia.com/gpu, amd.com/gpu, ...); not cpu, memory or a kubernetes.io resource.",
    )
    colocate: bool = Field(
        default=True,
        description="Trainer and rollout engines share the same GPUs, taking turns (engines release their "
        "memory while the trainer steps). false: separate trainer and rollout pods (disaggregated).",
    )
    trainer: TrainerResources = section(TrainerResources, "Trainer pods and GPUs.")
    rollout: RolloutResources = section(RolloutResources, "Rollout engine GPUs.")
    head: HeadSpec = section(HeadSpec, "The Ray head pod.")
    shm_size: Quantity = Field(
        default="16Gi", description="Size of /dev/shm in GPU pods (NCCL and CUDA IPC need a large one)."
    )
    image: Annotated[str, Field(min_length=1, max_length=1024, pattern=IMAGE_PATTERN)] = Field(
        default=RUNTIME_IMAGE,
        description="Runtime container image (rljob, Ray, torch, SGLang, Megatron): "
        "[registry[:port]/]path[:tag][@digest].",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of all pods."
    )
    image_pull_secrets: list[Name] = Field(
        default_factory=list, max_length=16, description="Names of Secrets for pulling the image."
    )
    node_selector: NodeSelector = Field(default_factory=dict, description="Node labels every pod requires.")
    tolerations: Tolerations = Field(default_factory=list, description="Tolerations of every pod.")
    affinity: Affinity | None = Field(
        default=None,
        description="Node and pod (anti-)affinity of every pod (core/v1 Affinity), e.g. to keep a job in one zone.",
    )
    priority_class_name: Name | None = Field(
        default=None, description="PriorityClass of the pods (preemption and queue order)."
    )
    service_account_name: Name | None = Field(
        default=None,
        description="ServiceAccount for the pods; by default the operator creates one that may only "
        "report this job's progress.",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Environment of every container."
    )
    labels: Labels = Field(default_factory=dict, description="Labels of every pod.")
    annotations: Annotations = Field(default_factory=dict, description="Annotations of every pod.")
    secrets: SecretsSpec = section(SecretsSpec, "Credentials from Secrets.")
    volumes: Volumes = Field(
        default_factory=list,
        description="Volumes mounted in every pod (head, trainer, rollout): models, data, hooks, caches. "
        "model.path, data.path and hooks may point inside them.",
    )
    model_cache: ModelCacheSpec | None = Field(
        default=None,
        description="A PersistentVolumeClaim for downloaded and converted models, shared by the jobs that "
        "name it (ReadWriteMany), so a model is downloaded once per revision. Without it each pod caches "
        "in its own ephemeral storage.",
    )
    security_context: PodSecurity = section(
        PodSecurity, "User and group of the containers (always non-root)."
    )
