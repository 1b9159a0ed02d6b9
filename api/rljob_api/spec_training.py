"""Training: trainer backend, schedule, optimizer and parallelism."""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

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
        description="Expert-parallel size for MoE models (Megatron EP): the experts are split over this "
        "many of the data-parallel ranks. The megatron backend builds MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral) at 1, every "
        "rank holding every expert. Not supported yet above 1: expert parallelism has run only on CPU "
        "ranks in tests, not yet on GPUs; a dense model refuses it.",
    )
    sequence_parallel: bool = Field(
        default=False,
        description="Megatron sequence parallelism over the tensor-parallel ranks (tensor > 1, training.backend "
        "megatron). Not supported yet: it has run only on CPU ranks in tests, not yet on GPUs, so true is "
        "refused.",
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
        description="Pack each data-parallel rank's samples of every optimizer step into micro-batches of "
        "at most maxTokensPerGpu tokens (prompt + response, no padding; each sample attends only to "
        "itself), balanced by token count. Replaces training.microBatchSize, which is then ignored. Loss, "
        "log-probs and gradients are those of the padded micro-batches.",
    )
    max_tokens_per_gpu: int = Field(
        default=16384,
        ge=1,
        le=16777216,
        description="Token budget of one packed micro-batch on one GPU (with dynamicBatch.enabled). It must "
        "hold the longest possible sample: data.maxPromptLength (1 when unset) + rollout.maxResponseLen. A "
        "longer sample (a prompt longer than the budget allows when data.maxPromptLength is unset, or a "
        "customGenerate response) is never truncated: it gets a micro-batch of its own.",
    )


MegatronArgs = Annotated[
    dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=1024)]],
    Field(max_length=64),
]

# The Megatron options training.megatronArgs passes through (Megatron-LM's names without the dashes), by
# value: "bool" ('' or 'true': on; 'false': off), "int" (a positive integer) or the allowed values. The
# runtime's trainer/megatron/megatron_args.py maps each to the megatron-core config field it sets (and
# must cover exactly these). Left out on purpose: what the spec owns (parallel sizes, lr, Adam, clipping,
# lengths), what needs TransformerEngine or apex, what has no effect with the local layer spec and SDPA
# (attention-softmax-in-fp32, init-method-std: weights come from the checkpoint), and overlap-param-gather
# (the weights sent to the engines after a step would be stale until the next forward).
MEGATRON_ARG_VALUES: dict[str, str | tuple[str, ...]] = {
    "overlap-grad-reduce": "bool",
    "ddp-bucket-size": "int",
    "check-for-nan-in-loss-and-grad": "bool",
    "recompute-granularity": ("full", "selective"),
    "recompute-method": ("uniform", "block"),
    "recompute-num-layers": "int",
}
MEGATRON_BOOL_VALUES = ("", "true", "false")

# training.fusions: the megatron backend's plain-torch model fusions (trainer/megatron/fusions.py takes its
# FUSIONS from here). All on when the field is unset: each was measured faster and smaller on GPU and
# checked no farther from an fp32 reference than the unfused model (docs/BENCHMARKS.md), and
# Megatron-LM turns its own counterparts on by default.
Fusion = Literal["swiglu", "wgrad", "norm", "rope"]
MEGATRON_FUSIONS: tuple[str, ...] = get_args(Fusion)
DEFAULT_FUSIONS: tuple[str, ...] = MEGATRON_FUSIONS
LMHead = Literal["chunked", "full"]
DEFAULT_LM_HEAD: str = "chunked"
MEGATRON_INT_PATTERN = "^[1-9][0-9]{0,9}$"  # RE2 (CEL matches) and Python re alike


def _cel_strs(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _megatron_arg_rules() -> tuple[Rule, ...]:
    names = list(MEGATRON_ARG_VALUES)
    bools = [k for k, v in MEGATRON_ARG_VALUES.items() if v == "bool"]
    ints = [k for k, v in MEGATRON_ARG_VALUES.items() if v == "int"]
    choices = {k: v for k, v in MEGATRON_ARG_VALUES.items() if isinstance(v, tuple)}
    arg = "self.megatronArgs"
    full = f"('recompute-granularity' in {arg} && {arg}['recompute-granularity'] == 'full')"
    return (
        Rule(
            cel=f"{arg}.all(k, k in {_cel_strs(names)})",
            message="megatronArgs takes only these Megatron options (without the leading dashes): "
            f"{', '.join(names)}; remove the others",
            field=".megatronArgs",
            check=lambda t: all(k in MEGATRON_ARG_VALUES for k in t.megatron_args),
        ),
        Rule(
            cel=f"{arg}.all(k, !(k in {_cel_strs(bools)}) || {arg}[k] in {_cel_strs(MEGATRON_BOOL_VALUES)})",
            message=f"megatronArgs {', '.join(bools)} take '' or 'true' (on) or 'false' (off)",
            field=".megatronArgs",
            check=lambda t: all(
                t.megatron_args[k] in MEGATRON_BOOL_VALUES for k in bools if k in t.megatron_args
            ),
        ),
        Rule(
            cel=f"{arg}.all(k, !(k in {_cel_strs(ints)}) || {arg}[k].matches('{MEGATRON_INT_PATTERN}'))",
            message=f"megatronArgs {', '.join(ints)} take a positive integer",
            field=".megatronArgs",
            check=lambda t: all(
                re.fullmatch(MEGATRON_INT_PATTERN, t.megatron_args[k]) for k in ints if k in t.megatron_args
            ),
        ),
        Rule(
            cel=" && ".join(
                f"(!('{k}' in {arg}) || {arg}['{k}'] in {_cel_strs(v)})" for k, v in choices.items()
            ),
            message="megatronArgs: " + "; ".join(f"{k} is {' or '.join(v)}" for k, v in choices.items()),
            field=".megatronArgs",
            check=lambda t: all(t.megatron_args[k] in v for k, v in choices.items() if k in t.megatron_args),
        ),
        Rule(
            cel=f"!self.recomputeActivations || !{arg}.exists(k, k.startsWith('recompute-'))",
            message="megatronArgs recompute-* set the recompute that recomputeActivations turns on: set "
            "recomputeActivations false to use them",
            field=".megatronArgs",
            check=lambda t: (
                not t.recompute_activations or not any(k.startswith("recompute-") for k in t.megatron_args)
            ),
        ),
        Rule(
            cel=f"!('recompute-method' in {arg} || 'recompute-num-layers' in {arg}) || {full}",
            message="megatronArgs recompute-method and recompute-num-layers need recompute-granularity full",
            field=".megatronArgs",
            check=lambda t: (
                not ({"recompute-method", "recompute-num-layers"} & set(t.megatron_args))
                or t.megatron_args.get("recompute-granularity") == "full"
            ),
        ),
        Rule(
            cel=f"!('ddp-bucket-size' in {arg}) || ('overlap-grad-reduce' in {arg} && "
            f"{arg}['overlap-grad-reduce'] != 'false')",
            message="megatronArgs ddp-bucket-size needs overlap-grad-reduce (without it the gradients are "
            "reduced in one bucket)",
            field=".megatronArgs",
            check=lambda t: (
                "ddp-bucket-size" not in t.megatron_args
                or t.megatron_args.get("overlap-grad-reduce", "false") != "false"
            ),
        ),
    )


class TrainingSpec(ApiModel):
    """The trainer and its schedule."""

    rules = (
        # What the runtime does not run yet (torch's model parallelism, dynamicBatch, ...): support.py.
        immutable("backend", "backend", hint="checkpoints are in this backend's format; create a new job"),
        immutable(
            "parallelism", "parallelism", hint="checkpoints are sharded for this layout; create a new job"
        ),
        *_megatron_arg_rules(),
        Rule(
            cel="!has(self.fusions) || self.fusions.all(f, self.fusions.exists_one(g, g == f))",
            message="fusions names each fusion once",
            field=".fusions",
            check=lambda t: t.fusions is None or len(set(t.fusions)) == len(t.fusions),
        ),
        Rule(
            cel="!self.dynamicBatch.enabled || self.microBatchSize == 1",
            message="training.microBatchSize is not used with training.dynamicBatch.enabled (maxTokensPerGpu "
            "sizes the micro-batches): leave it 1, or turn dynamicBatch off",
            field=".microBatchSize",
            check=lambda t: not t.dynamic_batch.enabled or t.micro_batch_size == 1,
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
        default=1,
        ge=1,
        le=65536,
        description="Samples per forward/backward pass on one data-parallel rank. With "
        "dynamicBatch.enabled maxTokensPerGpu sizes the micro-batches instead (and this must stay 1).",
    )
    seed: int = Field(default=42, ge=0, le=2147483647, description="Seed for data order, sampling and init.")
    optimizer: OptimizerSpec = section(OptimizerSpec, "AdamW and the learning-rate schedule.")
    parallelism: ParallelismSpec = section(ParallelismSpec, "Megatron model parallelism.")
    recompute_activations: bool = Field(
        default=False, description="Recompute activations in backward to save memory (full recompute)."
    )
    offload_optimizer: bool = Field(
        default=False,
        description="megatron on cuda: keep the optimizer's fp32 main parameters and Adam moments (12 of the "
        "16-18 bytes per parameter) in pinned host memory between steps and stream them through the GPU a "
        "chunk at a time at each optimizer step, for models whose optimizer state does not fit next to the "
        "weights, gradients and activations (a 4B model on one 80 GB GPU). Costs a host <-> GPU copy of the "
        "state per optimizer step.",
    )
    routing_replay: bool = Field(
        default=False,
        description="Rollout routing replay for mixture-of-experts models: SGLang returns the experts "
        "its router chose for every token of a response, and the trainer's forward passes (log-probs, "
        "reference, training) route those tokens to the same experts, so the trained policy and the one "
        "that sampled agree (slime's --use-rollout-routing-replay). megatron backend, sglang engine, MoE "
        "models only; the runtime refuses a dense model before it takes a GPU.",
    )
    dynamic_batch: DynamicBatchSpec = section(DynamicBatchSpec, "Token-budget micro-batching.")
    megatron_args: MegatronArgs = Field(
        default_factory=dict,
        description="Megatron options passed through to the megatron backend, Megatron-LM's names without "
        "the leading dashes, e.g. {overlap-grad-reduce: '', ddp-bucket-size: '40000000'}. Only these: "
        "overlap-grad-reduce, ddp-bucket-size (with overlap-grad-reduce), check-for-nan-in-loss-and-grad (on "
        "flags: '' or 'true'; 'false' is off), recompute-granularity (full or selective), recompute-method "
        "(uniform or block) and recompute-num-layers (with recompute-granularity full; default uniform, 1 "
        "layer); the recompute options only with recomputeActivations false. training.backend megatron only.",
    )
    fusions: Annotated[list[Fusion], Field(max_length=len(MEGATRON_FUSIONS))] | None = Field(
        default=None,
        description="megatron backend: the fusions its model is built with, plain torch (no TransformerEngine "
        "or apex): swiglu (megatron-core's compiled SwiGLU, which also keeps fewer activations), wgrad "
        "(Megatron's gradient-accumulation fusion: each linear's weight gradient accumulated by its GEMM "
        "straight into the fp32 main gradient), norm (a compiled RMSNorm) and rope (a compiled RoPE). Unset: "
        "all four on GPUs; [] builds the model unfused. The compiled ones (swiglu, norm, rope) compile on each "
        "trainer rank's first steps (seconds to tens of seconds, again after a trainer restart). "
        "training.backend megatron only.",
    )
    lm_head: LMHead | None = Field(
        default=None,
        description="megatron backend: how the log-probs and entropy of the response tokens come from the "
        "last hidden states. chunked (unset: the default): their logits a chunk of tokens at a time in fp32 "
        "(about 256 MiB per chunk), recomputed in backward, never the whole [tokens, vocabulary] tensor, and "
        "none for prompt or padding positions; full: Megatron's output layer over every position, then "
        "log-softmax and entropy over the response tokens' logits. The same values up to fp32 rounding. "
        "training.backend megatron only.",
    )

    def megatron_fusions(self) -> tuple[str, ...]:
        """The fusions the megatron backend builds with: training.fusions, or the default when unset."""
        return DEFAULT_FUSIONS if self.fusions is None else tuple(self.fusions)

    def chunked_lm_head(self) -> bool:
        """Whether the megatron backend uses the chunked LM head: training.lmHead, or the default."""
        return (self.lm_head or DEFAULT_LM_HEAD) == "chunked"
