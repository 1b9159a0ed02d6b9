"""Will the megatron trainer fit its GPU? An estimate from the model's config and the spec, made by each
rank before it builds anything, so a layout that cannot fit is refused with the numbers and the
options that would make it fit instead of running out of memory minutes later.

Per GPU (the largest pipeline stage; mixed precision as ``backend.py`` builds it):

- weights: 2 bytes per parameter of this rank's TP/PP shard (bf16), the reference model the same; an
  MoE layer's (``ModelShape.moe``) MLP is its router [E, h] and this EP rank's E / ep experts (gate,
  up and down: 3 h f_moe each, never TP-split), instead of the dense MLP;
- gradients: 4 bytes (DDP's fp32 gradient buffer, ``grad_reduce_in_fp32``);
- optimizer: fp32 main params + two Adam moments, 12 bytes, divided over the data-parallel ranks (the
  distributed optimizer); experts' over the expert data-parallel ranks (tp x dp / ep: the ranks that
  hold the same experts); with ``training.offloadOptimizer`` only the chunks being streamed;
- activations: per token and layer about 2 bytes x (6 h + 2 (q + 2 kv) + 3 ffn) kept for backward
  (norm inputs, q/k/v, attention output, the SwiGLU's three ffn-wide tensors; flash/cuDNN attention,
  so no s x s scores); an MoE layer keeps top_k x (3 f_moe + 2 h) instead of 3 ffn (each token's k
  experts' SwiGLU tensors, and the dispatcher's permuted copies of its hidden state in and out) plus
  E router scores. Approximated: routing is taken as balanced (an EP rank gets its share of the k x
  tokens expert slots; a skewed router gives some ranks more), and the dispatcher's buffers beyond
  those two copies are not counted. With full recompute, 2 h per layer plus one layer's worth; tokens per
  micro-batch: dynamicBatch.maxTokensPerGpu, else microBatchSize x (rollout.maxResponseLen +
  data.maxPromptLength when set: the prompt is not counted otherwise, so this errs towards admitting);
- logits: the LM head's bf16 logits, their fp32 log-softmax and its gradient (10 bytes per token and
  vocabulary entry of this TP rank); with the chunked head (training.lmHead chunked, the default) the
  fp32 logits of at most three chunks at a time in backward (``lm_head.CHUNK_BYTES`` each, fewer for a
  micro-batch smaller than a chunk), whatever the tokens;
- critic (advantageEstimator ppo): the value model's weights, gradients and optimizer state as the
  policy's (it is built at the policy's layout, and by default from the same model; its activations
  come after the policy's backward, so they do not add; an algorithm.critic.path of another shape
  is counted as the policy's too);
- overhead: CUDA context, NCCL and allocator slack (3 GiB), plus the engine's residue when colocated
  (2 GiB: what SGLang keeps while released, docs/BENCHMARKS.md, commit b9bac05).

An estimate, not a promise: the refusal threshold is the whole GPU, so only a layout that clearly
cannot fit is refused; the log line shows every figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from rljob_api.spec import RLTrainingJobSpec

from .arch import ModelShape
from .parallel import Parallelism

GiB = 1 << 30
OVERHEAD_BYTES = 3 * GiB
COLOCATED_ENGINE_BYTES = 2 * GiB
STREAM_CHUNK_BYTES = 2 * GiB  # optimizer_offload.DEFAULT_CHUNK_BYTES
STREAMED_CHUNKS = 3  # in, being updated, out
HEAD_CHUNK_BYTES = 256 * 2**20  # lm_head.CHUNK_BYTES (kept here: this module imports no torch)
HEAD_CHUNKS = 3  # the chunked head's backward: logits, softmax, their gradient


@dataclass(frozen=True)
class Knobs:
    """What the estimate depends on, besides the model's shape."""

    tp: int
    pp: int
    dp: int
    micro_tokens: int
    recompute: bool
    offload_optimizer: bool
    reference: bool
    colocated: bool
    chunked_head: bool = False
    critic: bool = False
    ep: int = 1  # expert parallel size (MoE): experts split over ep of the data-parallel ranks


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    reference: int
    critic: int
    activations: int
    logits: int
    overhead: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def summary(self) -> str:
        parts = ", ".join(
            f"{f.name} {getattr(self, f.name) / GiB:.1f}" for f in fields(self) if getattr(self, f.name)
        )
        return f"{self.total / GiB:.1f} GiB ({parts})"


@dataclass(frozen=True)
class StageParams:
    """The parameters of this GPU's pipeline stage (the largest one), in two parts that the
    distributed optimizer shards differently."""

    dense: int  # every replica holds them: optimizer state over the data-parallel ranks
    experts: int  # this EP rank's experts: optimizer state over the expert data-parallel ranks
    largest: int  # the largest single tensor (an offloaded optimizer streams at least one whole)

    @property
    def total(self) -> int:
        return self.dense + self.experts


def _largest_stage(shape: ModelShape, pp: int) -> range:
    """The layers of the pipeline stage with the most MoE layers (the first when they tie, or for a
    dense model): layers split evenly, as ``validate_parallelism`` requires."""
    per = -(-shape.num_layers // pp)
    stages = [range(s * per, min((s + 1) * per, shape.num_layers)) for s in range(pp)]
    moe = shape.moe
    return max(stages, key=lambda layers: sum(moe.is_moe(i) for i in layers) if moe else 0)


def _attention_params(shape: ModelShape, tp: int) -> int:
    """One layer's attention (qkv, proj, their biases and q/k norms) and its two norms."""
    h, q, kv = shape.hidden_size, shape.q_size, shape.kv_size
    params = (h * (q + 2 * kv) + q * h) // tp + 2 * h
    if shape.qkv_bias:
        params += (q + 2 * kv) // tp
    if shape.qk_norm:
        params += 2 * shape.head_dim
    return params


def stage_param_counts(shape: ModelShape, tp: int, pp: int, ep: int = 1) -> StageParams:
    """``StageParams`` of the largest pipeline stage's share of one TP (and EP) rank: the embedding on
    the first stage and the output layer on the last (tied models keep a copy on both when pp > 1, as
    Megatron does); an MoE layer's router (replicated) and its E / ep local experts (not TP-split)."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    layers = _largest_stage(shape, pp)
    moe = shape.moe
    moe_layers = sum(moe.is_moe(i) for i in layers) if moe else 0
    dense_mlps = len(layers) - moe_layers
    embedding = shape.vocab_size * h // tp
    heads = 2 if pp == 1 and not shape.tied_embeddings else 1  # embedding (+ output layer)
    dense = len(layers) * _attention_params(shape, tp) + dense_mlps * 3 * h * f // tp
    dense += heads * embedding + h  # the final norm
    largest = max(embedding, 3 * h * f // tp if dense_mlps else 0)
    experts = 0
    if moe is not None and moe_layers:
        expert = 3 * h * moe.expert_ffn_hidden_size  # gate, up, down
        dense += moe_layers * moe.num_experts * h  # the routers
        experts = moe_layers * (moe.num_experts // ep) * expert
        largest = max(largest, moe.num_experts * h, expert)
        if moe.shared_expert_ffn_hidden_size is not None:  # Qwen2-MoE: on every rank, TP-split, and its gate
            shared = 3 * h * moe.shared_expert_ffn_hidden_size // tp
            dense += moe_layers * (shared + h)
            largest = max(largest, shared)
    return StageParams(dense=dense, experts=experts, largest=largest)


def stage_params(shape: ModelShape, tp: int, pp: int, ep: int = 1) -> tuple[int, int]:
    """(parameters on this GPU, its largest single tensor): ``stage_param_counts`` in one number."""
    counts = stage_param_counts(shape, tp, pp, ep)
    return counts.total, counts.largest


def layer_activation_bytes(shape: ModelShape, tp: int, moe_layer: bool) -> int:
    """Bytes kept for backward per token of one layer (the module docstring's activations)."""
    h, q, kv = shape.hidden_size, shape.q_size, shape.kv_size
    attention = 6 * h + 2 * (q + 2 * kv) // tp
    moe = shape.moe
    if moe_layer and moe is not None:
        mlp = moe.top_k * (3 * moe.expert_ffn_hidden_size + 2 * h) + moe.num_experts
        if moe.shared_expert_ffn_hidden_size is not None:  # a dense MLP of its width beside them
            mlp += 3 * moe.shared_expert_ffn_hidden_size // tp
    else:
        mlp = 3 * shape.ffn_hidden_size // tp
    return 2 * (attention + mlp)


def _optimizer_bytes(counts: StageParams, knobs: Knobs) -> int:
    if knobs.offload_optimizer:
        # The largest tensor's chunk (a chunk holds at least one tensor) and the other chunks in flight.
        return (
            max(STREAM_CHUNK_BYTES, 12 * counts.largest // knobs.dp)
            + (STREAMED_CHUNKS - 1) * STREAM_CHUNK_BYTES
        )
    expert_dp = max(1, knobs.tp * knobs.dp // knobs.ep)  # ranks holding the same experts
    return 12 * counts.dense // knobs.dp + 12 * counts.experts // expert_dp


def estimate(shape: ModelShape, knobs: Knobs) -> MemoryEstimate:
    counts = stage_param_counts(shape, knobs.tp, knobs.pp, knobs.ep)
    params = counts.total
    optimizer = _optimizer_bytes(counts, knobs)
    h, t = shape.hidden_size, knobs.micro_tokens
    stage = _largest_stage(shape, knobs.pp)
    moe = shape.moe
    per_layer = [layer_activation_bytes(shape, knobs.tp, moe is not None and moe.is_moe(i)) for i in stage]
    # Pipeline stages hold up to pp micro-batches in flight (1F1B): the first stage the most.
    in_flight = knobs.pp
    if knobs.recompute:
        activations = t * (2 * h * len(stage) * in_flight + max(per_layer))
    else:
        activations = t * sum(per_layer) * in_flight
    if knobs.chunked_head:
        logits = HEAD_CHUNKS * min(HEAD_CHUNK_BYTES, 4 * t * shape.vocab_size // knobs.tp)
    else:
        logits = 10 * t * shape.vocab_size // knobs.tp
    return MemoryEstimate(
        weights=2 * params,
        gradients=4 * params,
        optimizer=optimizer,
        reference=2 * params if knobs.reference else 0,
        critic=2 * params + 4 * params + optimizer if knobs.critic else 0,
        activations=activations,
        logits=logits,
        overhead=OVERHEAD_BYTES + (COLOCATED_ENGINE_BYTES if knobs.colocated else 0),
    )


def knobs_from_spec(spec: RLTrainingJobSpec, par: Parallelism) -> Knobs:
    training = spec.training
    if training.dynamic_batch.enabled:
        tokens = training.dynamic_batch.max_tokens_per_gpu
    else:
        tokens = training.micro_batch_size * (
            spec.rollout.max_response_len + (spec.data.max_prompt_length or 0)
        )
    return Knobs(
        tp=par.tp,
        pp=par.pp,
        dp=par.dp,
        ep=par.ep,
        micro_tokens=tokens,
        # megatronArgs recompute-granularity full replaces recomputeActivations (the API allows one).
        recompute=training.recompute_activations
        or training.megatron_args.get("recompute-granularity") == "full",
        offload_optimizer=training.offload_optimizer,
        reference=spec.algorithm.use_kl_loss or spec.algorithm.kl_coef > 0,
        colocated=spec.resources.colocate,
        chunked_head=training.chunked_lm_head(),
        critic=spec.algorithm.advantage_estimator == "ppo",
    )


def alternatives(shape: ModelShape, knobs: Knobs, gpus: int) -> list[tuple[str, MemoryEstimate]]:
    """Changes to the spec that lower the estimate, each with its new estimate (the ones that apply)."""
    out: list[tuple[str, MemoryEstimate]] = []
    if not knobs.offload_optimizer:
        out.append(
            ("training.offloadOptimizer: true", estimate(shape, replace(knobs, offload_optimizer=True)))
        )
    if not knobs.recompute:
        out.append(("training.recomputeActivations: true", estimate(shape, replace(knobs, recompute=True))))
    if not knobs.chunked_head:
        out.append(("training.lmHead: chunked", estimate(shape, replace(knobs, chunked_head=True))))
    tp = knobs.tp * 2
    dense = shape.moe is None  # MoE layers with tp > 1 are refused (``parallel._expert_problems``)
    if dense and tp * knobs.pp <= gpus and shape.num_heads % tp == 0 and shape.num_kv_heads % tp == 0:
        dp = max(1, gpus // (tp * knobs.pp))
        out.append((f"training.parallelism.tensor: {tp}", estimate(shape, replace(knobs, tp=tp, dp=dp))))
    if knobs.micro_tokens > 1:
        half = replace(knobs, micro_tokens=knobs.micro_tokens // 2)
        out.append(
            (
                "half the tokens per micro-batch (microBatchSize or dynamicBatch.maxTokensPerGpu)",
                estimate(shape, half),
            )
        )
    every = replace(knobs, offload_optimizer=True, recompute=True)
    if every != knobs:
        out.append(("offloadOptimizer and recomputeActivations together", estimate(shape, every)))
    return out


def check_fits(
    shape: ModelShape, spec: RLTrainingJobSpec, par: Parallelism, gpu_bytes: int
) -> MemoryEstimate:
    """The estimate for this spec; ValueError with the figures and what would fit when it exceeds
    ``gpu_bytes`` (the GPU's total memory)."""
    knobs = knobs_from_spec(spec, par)
    mine = estimate(shape, knobs)
    if mine.total <= gpu_bytes:
        return mine
    options = [
        f"  {what}: {est.total / GiB:.1f} GiB{' (fits)' if est.total <= gpu_bytes else ''}"
        for what, est in alternatives(shape, knobs, par.world_size)
    ]
    raise ValueError(
        f"the megatron trainer does not fit a {gpu_bytes / GiB:.1f} GiB GPU: estimated {mine.summary()} per GPU "
        f"at tensor {par.tp} x pipeline {par.pp} x data {par.dp}"
        + (f" (expert {par.ep})" if par.ep > 1 else "")
        + f", {knobs.micro_tokens} tokens per micro-batch. "
        "Estimates with one change:\n" + "\n".join(options)
    )


def check_this_gpu(
    shape: ModelShape, spec: RLTrainingJobSpec, par: Parallelism, rank: int
) -> MemoryEstimate | None:
    """``check_fits`` against this process's GPU (LOCAL_RANK's, the one the rank's process group takes),
    printed for the job's log; None without a GPU (CPU smoke tests)."""
    import torch

    if not torch.cuda.is_available():
        return None
    gpu_bytes = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory
    estimate = check_fits(shape, spec, par, gpu_bytes)
    print(f"megatron rank {rank}: estimated GPU memory {estimate.summary()}", flush=True)
    return estimate
