"""Training: trainer backend, schedule, optimizer and parallelism."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, section
from .rules import Rule, immutable


class ParallelismSpec(ApiModel):
    """Megatron model parallelism. Data parallelism is what remains: trainer GPUs / (tensor*pipeline*context)."""

    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size (Megatron TP).")
    pipeline: int = Field(default=1, ge=1, le=128, description="Pipeline-parallel size (Megatron PP).")
    context: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Context-parallel size (Megatron CP). Not supported yet: only 1 runs (it needs "
        "TransformerEngine's attention).",
    )
    expert: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Expert-parallel size for MoE models (Megatron EP). Not supported yet: only 1 runs.",
    )
    sequence_parallel: bool = Field(
        default=False,
        description="Megatron sequence parallelism (with tensor > 1). Not supported yet: true is refused.",
    )


class OptimizerSpec(ApiModel):
    """AdamW and the learning-rate schedule."""

    rules = (
        Rule(
            cel="self.minLr <= self.lr",
            message="minLr must not exceed lr",
            field=".minLr",
            check=lambda o: o.min_lr <= o.lr,
        ),
    )

    lr: float = Field(default=1e-6, gt=0.0, le=1.0, description="Peak learning rate.")
    min_lr: float = Field(default=0.0, ge=0.0, le=1.0, description="Final learning rate of the decay.")
    lr_decay_style: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="Learning-rate decay after warm-up."
    )
    lr_warmup_steps: int = Field(
        default=0, ge=0, le=10000000, description="Linear warm-up in optimizer steps."
    )
    weight_decay: float = Field(default=0.0, ge=0.0, le=10.0, description="AdamW weight decay.")
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(default=0.98, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(default=1e-8, gt=0.0, le=1.0, description="AdamW epsilon.")
    clip_grad: float = Field(default=1.0, ge=0.0, le=1000.0, description="Gradient-norm clip; 0 disables it.")


class DynamicBatchSpec(ApiModel):
    """Pack micro-batches by token count instead of a fixed number of samples."""

    enabled: bool = Field(
        default=False,
        description="Pack micro-batches up to maxTokensPerGpu tokens. Not supported yet: true is refused.",
    )
    max_tokens_per_gpu: int = Field(
        default=16384, ge=1, le=16777216, description="Token budget of one micro-batch on one GPU."
    )


MegatronArgs = Annotated[
    dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=1024)]],
    Field(max_length=64),
]


class TrainingSpec(ApiModel):
    """The trainer and its schedule."""

    rules = (
        # What the runtime does not run yet (torch's model parallelism, dynamicBatch, ...): support.py.
        immutable("backend", "backend", hint="checkpoints are in this backend's format; create a new job"),
        immutable(
            "parallelism", "parallelism", hint="checkpoints are sharded for this layout; create a new job"
        ),
    )

    backend: Literal["megatron", "torch"] = Field(
        default="megatron",
        description="megatron: Megatron-core (GPU; tensor and pipeline parallelism); torch: "
        "transformers + torch distributed data parallel (CPU-capable, small models, tests).",
    )
    num_rollout: int = Field(
        default=100, ge=1, le=10000000, description="Rollout steps to run; the job succeeds after the last."
    )
    global_batch_size: int = Field(
        default=256,
        ge=1,
        le=16777216,
        description="Samples per optimizer step. rollout.batchSize * rollout.nSamplesPerPrompt must be a "
        "multiple of it; the quotient is the number of optimizer steps per rollout.",
    )
    micro_batch_size: int = Field(
        default=1, ge=1, le=65536, description="Samples per forward/backward pass on one data-parallel rank."
    )
    seed: int = Field(default=42, ge=0, le=2147483647, description="Seed for data order, sampling and init.")
    optimizer: OptimizerSpec = section(OptimizerSpec, "AdamW and the learning-rate schedule.")
    parallelism: ParallelismSpec = section(ParallelismSpec, "Megatron model parallelism.")
    recompute_activations: bool = Field(
        default=False, description="Recompute activations in backward to save memory (full recompute)."
    )
    dynamic_batch: DynamicBatchSpec = section(DynamicBatchSpec, "Token-budget micro-batching.")
    megatron_args: MegatronArgs = Field(
        default_factory=dict,
        description="Extra Megatron arguments without the leading dashes, e.g. {overlap-grad-reduce: ''}. "
        "Not supported yet: a non-empty map is refused.",
    )
