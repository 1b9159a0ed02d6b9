"""RLTrainingJobSpec: the whole desired state of one RL post-training run."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import ApiModel, LabelName, section
from .rules import Rule, immutable
from .spec_algorithm import AlgorithmSpec
from .spec_ops import CheckpointSpec, FaultToleranceSpec
from .spec_resources import ResourcesSpec
from .spec_rollout import RolloutSpec
from .spec_training import TrainingSpec
from .spec_workload import DataSpec, ModelSpec, RewardSpec

# CEL snippets over the spec (`self`), reused by several rules.
_TRAINER_GPUS = "(self.resources.trainer.nodes * self.resources.trainer.gpusPerNode)"
_MODEL_PARALLEL = (
    "(self.training.parallelism.tensor * self.training.parallelism.pipeline"
    " * self.training.parallelism.context)"
)
_MICRO_BATCH = "(self.training.dynamicBatch.enabled ? 1 : self.training.microBatchSize)"


def trainer_gpus(spec: RLTrainingJobSpec) -> int:
    """GPUs (or CPU slots) of the trainer: nodes x gpusPerNode."""
    return spec.resources.trainer.nodes * spec.resources.trainer.gpus_per_node


def model_parallel_size(spec: RLTrainingJobSpec) -> int:
    p = spec.training.parallelism
    return p.tensor * p.pipeline * p.context


def data_parallel_size(spec: RLTrainingJobSpec) -> int:
    return trainer_gpus(spec) // model_parallel_size(spec)


def _micro_batch(spec: RLTrainingJobSpec) -> int:
    return 1 if spec.training.dynamic_batch.enabled else spec.training.micro_batch_size


_SPEC_RULES = (
    Rule(
        cel="(self.rollout.batchSize * self.rollout.nSamplesPerPrompt) % self.training.globalBatchSize == 0",
        message="rollout.batchSize * rollout.nSamplesPerPrompt must be a multiple of training.globalBatchSize, "
        "so that every rollout fills whole optimizer steps",
        field=".training.globalBatchSize",
        check=lambda s: (
            (s.rollout.batch_size * s.rollout.n_samples_per_prompt) % s.training.global_batch_size == 0
        ),
    ),
    Rule(
        cel=f"{_TRAINER_GPUS} % {_MODEL_PARALLEL} == 0",
        message="training.parallelism tensor * pipeline * context must divide the trainer GPUs "
        "(resources.trainer.nodes * resources.trainer.gpusPerNode)",
        field=".training.parallelism",
        check=lambda s: trainer_gpus(s) % model_parallel_size(s) == 0,
    ),
    # (training.parallelism.expert above 1 is refused until MoE is supported: TrainingSpec's rules; the
    # layout rule "expert divides the trainer GPUs per pipeline stage" comes back with it.)
    Rule(
        # Only checked once the model-parallel rule holds (it reports that case), so the divisor is >= 1.
        cel=f"{_TRAINER_GPUS} % {_MODEL_PARALLEL} != 0 || self.training.globalBatchSize % "
        f"({_MICRO_BATCH} * ({_TRAINER_GPUS} / {_MODEL_PARALLEL})) == 0",
        message="training.globalBatchSize must be a multiple of training.microBatchSize * data-parallel size "
        "(data-parallel size = trainer GPUs / (tensor * pipeline * context); microBatchSize counts as 1 with "
        "dynamicBatch)",
        field=".training.globalBatchSize",
        check=lambda s: (
            trainer_gpus(s) % model_parallel_size(s) != 0
            or s.training.global_batch_size % (_micro_batch(s) * data_parallel_size(s)) == 0
        ),
    ),
    Rule(
        cel="self.resources.device != 'cpu' || (self.rollout.engine == 'hf' && self.training.backend == 'torch')",
        message="resources.device cpu needs rollout.engine hf and training.backend torch",
        field=".resources.device",
        check=lambda s: (
            s.resources.device != "cpu" or (s.rollout.engine == "hf" and s.training.backend == "torch")
        ),
    ),
    Rule(
        cel="!self.rollout.async.enabled || !self.resources.colocate",
        message="rollout.async.enabled needs resources.colocate false: colocated engines and trainer take "
        "turns on the same GPUs, so generation cannot overlap training",
        field=".rollout.async.enabled",
        check=lambda s: not (s.rollout.async_.enabled and s.resources.colocate),
    ),
    Rule(
        cel="!self.algorithm.dynamicSampling.enabled || !has(self.algorithm.dynamicSampling.overSamplingBatchSize)"
        " || self.algorithm.dynamicSampling.overSamplingBatchSize >= self.rollout.batchSize",
        message="algorithm.dynamicSampling.overSamplingBatchSize must be at least rollout.batchSize",
        field=".algorithm.dynamicSampling.overSamplingBatchSize",
        check=lambda s: (
            not s.algorithm.dynamic_sampling.enabled
            or s.algorithm.dynamic_sampling.over_sampling_batch_size is None
            or s.algorithm.dynamic_sampling.over_sampling_batch_size >= s.rollout.batch_size
        ),
    ),
    Rule(
        cel="self.training.backend != 'megatron' || self.algorithm.advantageEstimator != 'ppo'",
        message="algorithm.advantageEstimator ppo is not supported yet by training.backend megatron (no "
        "critic there): use backend torch",
        field=".algorithm.advantageEstimator",
        check=lambda s: s.training.backend != "megatron" or s.algorithm.advantage_estimator != "ppo",
    ),
    Rule(
        cel="!has(self.model.megatronCheckpoint)",
        message="model.megatronCheckpoint is not supported yet: the trainer starts from the Hugging Face "
        "weights of model.path",
        field=".model.megatronCheckpoint",
        check=lambda s: s.model.megatron_checkpoint is None,
    ),
    immutable("model", "model", hint="a different model is a different job; create a new RLTrainingJob"),
)


class RLTrainingJobSpec(ApiModel):
    """Desired state of an RL post-training run (GRPO and friends) of one LLM on Kubernetes."""

    rules = _SPEC_RULES

    model: ModelSpec = Field(description="The policy model to train.")
    data: DataSpec = Field(description="Prompt data and evaluation sets.")
    algorithm: AlgorithmSpec = section(AlgorithmSpec, "Advantage estimator, policy loss, KL, TIS.")
    rollout: RolloutSpec = section(RolloutSpec, "Generation: engine, batch, sampling, router, async.")
    training: TrainingSpec = section(TrainingSpec, "Trainer backend, schedule, optimizer, parallelism.")
    resources: ResourcesSpec = section(ResourcesSpec, "GPUs, pods, placement, image, environment, secrets.")
    reward: RewardSpec = section(RewardSpec, "How responses are scored.")
    checkpoint: CheckpointSpec = section(CheckpointSpec, "Where checkpoints go, how often, resume, export.")
    fault_tolerance: FaultToleranceSpec = section(
        FaultToleranceSpec, "Engine health checks and restarts, trainer restarts, job retries."
    )
    suspend: bool = Field(
        default=False,
        description="true stops the job and frees its GPUs (the Ray cluster is deleted); false resumes it "
        "from the latest checkpoint.",
    )
    queue_name: LabelName | None = Field(
        default=None,
        description="Kueue LocalQueue to submit the job to; Kueue then admits it when its whole GPU gang fits.",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=31536000, description="Fail the job if it runs longer than this."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=31536000,
        description="Delete the job's pods and Ray cluster this long after it finishes (the RLTrainingJob stays).",
    )

    def total_gpus(self) -> int:
        """GPUs the job requests from the cluster (0 for device cpu)."""
        if self.resources.device == "cpu":
            return 0
        trainer = trainer_gpus(self)
        if self.resources.colocate:
            return trainer
        return trainer + (self.resources.rollout.gpus or 0)

    def to_document(self) -> dict[str, Any]:
        """The spec as it appears in YAML (camelCase, defaults filled, unset optionals left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
