"""RLTrainingJobSpec: the whole desired state of one RL post-training run."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import ApiModel, LabelName, section
from .rules import Rule, immutable
from .spec_algorithm import AlgorithmSpec
from .spec_ops import EXPORT_RULES, CheckpointSpec, FaultToleranceSpec
from .spec_resources import ResourcesSpec
from .spec_rollout import RolloutSpec
from .spec_training import TrainingSpec
from .spec_volumes import CHECKPOINT_MOUNT_RULES
from .spec_workload import DataSpec, ModelSpec, RewardSpec
from .support import SUPPORT_RULES

# CEL snippets over the spec (`self`), reused by several rules.
_TRAINER_GPUS = "(self.resources.trainer.nodes * self.resources.trainer.gpusPerNode)"
_MODEL_PARALLEL = (
    "(self.training.parallelism.tensor * self.training.parallelism.pipeline"
    " * self.training.parallelism.context)"
)
# With training.dynamicBatch the micro-batches are token budgets: microBatchSize is ignored (counts as 1).
_MICRO_BATCH = "(self.training.dynamicBatch.enabled ? 1 : self.training.microBatchSize)"
_LONGEST_SAMPLE = (
    "(self.rollout.maxResponseLen + (has(self.data.maxPromptLength) ? self.data.maxPromptLength : 1))"
)


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


def longest_sample(spec: RLTrainingJobSpec) -> int:
    """The most tokens (prompt + response) a plain rollout's sample can have: data.maxPromptLength
    (1 when unset: a prompt has a token at least) + rollout.maxResponseLen."""
    return spec.rollout.max_response_len + (spec.data.max_prompt_length or 1)


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
    # (training.parallelism.expert above 1 is refused until expert parallelism is shown on GPUs:
    # support.py. Whether it divides a pipeline stage's ranks and the model's experts is checked by the
    # runtime against config.json: trainer/megatron/parallel.py.)
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
        # A sample is never truncated and never split over micro-batches (its tokens attend to each
        # other): the budget must hold the longest one the spec allows.
        cel=f"!self.training.dynamicBatch.enabled || {_LONGEST_SAMPLE} <= "
        "self.training.dynamicBatch.maxTokensPerGpu",
        message="training.dynamicBatch.maxTokensPerGpu must hold the longest sample, data.maxPromptLength (1 "
        "when unset) + rollout.maxResponseLen tokens: raise it, or lower rollout.maxResponseLen or "
        "data.maxPromptLength",
        field=".training.dynamicBatch.maxTokensPerGpu",
        check=lambda s: (
            not s.training.dynamic_batch.enabled
            or longest_sample(s) <= s.training.dynamic_batch.max_tokens_per_gpu
        ),
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
        cel="!self.algorithm.dynamicSampling.enabled || self.rollout.nSamplesPerPrompt >= 2",
        message="algorithm.dynamicSampling needs rollout.nSamplesPerPrompt >= 2: a group of one sample has no "
        "reward variance, so every group would be dropped",
        field=".algorithm.dynamicSampling.enabled",
        check=lambda s: not s.algorithm.dynamic_sampling.enabled or s.rollout.n_samples_per_prompt >= 2,
    ),
    Rule(
        cel="!self.rollout.partialRollout || self.algorithm.dynamicSampling.enabled || self.rollout.async.enabled",
        message="rollout.partialRollout needs algorithm.dynamicSampling.enabled (the requests aborted when a "
        "step has its batch are continued next step) or rollout.async.enabled (a weight push aborts the "
        "requests in flight, which continue under the new weights); without either nothing is aborted",
        field=".rollout.partialRollout",
        check=lambda s: (
            not s.rollout.partial_rollout or s.algorithm.dynamic_sampling.enabled or s.rollout.async_.enabled
        ),
    ),
    Rule(
        cel="!has(self.rollout.customFilter) || self.algorithm.dynamicSampling.enabled",
        message="rollout.customFilter filters the groups of algorithm.dynamicSampling: set "
        "algorithm.dynamicSampling.enabled true, or remove it",
        field=".rollout.customFilter",
        check=lambda s: s.rollout.custom_filter is None or s.algorithm.dynamic_sampling.enabled,
    ),
    Rule(
        cel="!self.training.offloadOptimizer || (self.training.backend == 'megatron' && "
        "self.resources.device == 'cuda')",
        message="training.offloadOptimizer moves the megatron backend's optimizer state from the GPU to host "
        "memory: it needs training.backend megatron and resources.device cuda (on a CPU there is nothing to "
        "offload); set it false",
        field=".training.offloadOptimizer",
        check=lambda s: (
            not s.training.offload_optimizer
            or (s.training.backend == "megatron" and s.resources.device == "cuda")
        ),
    ),
    # What the runtime does not run yet (device x engine x backend x mode x features): support.py.
    *SUPPORT_RULES,
    immutable("model", "model", hint="a different model is a different job; create a new RLTrainingJob"),
    Rule(
        cel="!has(oldSelf.workloadPriorityClassName) || has(self.workloadPriorityClassName)",
        message="workloadPriorityClassName cannot be removed once set (Kueue refuses to take a Workload's "
        "priority class away); set another WorkloadPriorityClass instead",
        field=".workloadPriorityClassName",
        check=lambda old, new: (
            old.workload_priority_class_name is None or new.workload_priority_class_name is not None
        ),
        transition=True,
    ),
    *CHECKPOINT_MOUNT_RULES,
    *EXPORT_RULES,
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
    workload_priority_class_name: LabelName | None = Field(
        default=None,
        description="Kueue WorkloadPriorityClass of the job (label kueue.x-k8s.io/priority-class on its RayJob): "
        "the order in which Kueue admits and preempts it, without changing its pods' priority. Without it Kueue "
        "takes the priority of resources.priorityClassName. Kueue refuses to add it while the job runs.",
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
