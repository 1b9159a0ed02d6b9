"""Parallelism checks, done before any GPU work, and Megatron's vocab padding.

Megatron asserts deep inside model construction (often on one rank only, after NCCL is up) when a
size does not divide; these checks refuse the same layouts up front with the numbers in the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .arch import ModelShape, model_shape

# Megatron-LM's --make-vocab-size-divisible-by default.
VOCAB_DIVISIBLE_BY = 128


@dataclass(frozen=True)
class Parallelism:
    """Megatron's layout of ``tp * pp * cp * dp`` GPUs. ``ep``: expert parallelism (MoE), carved out
    of the ``tp * cp * dp`` ranks of each pipeline stage, as megatron-core does with expert tensor
    parallel size 1: ``ep`` consecutive data-parallel ranks split the experts, and it adds no GPUs."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Megatron pads the vocab to a multiple of ``divisible_by * tp`` so each TP rank holds an equal
    slice of the embedding and output layer."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def validate_parallelism(
    config: Any,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    dp: int | None = None,
    ep: int = 1,
    gpus: int,
    transformer_engine: bool = False,
) -> Parallelism:
    """Check a layout against a model (HF config or ``ModelShape``) and a GPU count.

    ``dp`` defaults to what is left: gpus / (tp * pp * cp). Raises ValueError naming every problem
    found (all of them, so a user fixes the spec once). ``transformer_engine``: context parallelism
    needs TransformerEngine's attention; the local layer spec we build supports cp = 1 only. ``ep``:
    expert parallelism of an MoE model (``_expert_problems``).
    """
    shape = config if isinstance(config, ModelShape) else model_shape(config)
    sizes = {"tensor": tp, "pipeline": pp, "context": cp, "expert": ep, "gpus": gpus}
    if dp is not None:
        sizes["data"] = dp
    bad = [f"{name} parallel size {value}" for name, value in sizes.items() if value < 1]
    if bad:
        raise ValueError(f"parallelism: sizes must be >= 1: {', '.join(bad)}")
    problems: list[str] = []
    model_parallel = tp * pp * cp
    if dp is None:
        if gpus % model_parallel:
            problems.append(
                f"{gpus} GPUs are not a multiple of tensor {tp} x pipeline {pp} x context {cp} = {model_parallel}"
            )
        dp = max(gpus // model_parallel, 1)
    elif model_parallel * dp != gpus:
        problems.append(
            f"tensor {tp} x pipeline {pp} x context {cp} x data {dp} = {model_parallel * dp} "
            f"does not equal the {gpus} GPUs"
        )
    if shape.num_heads % tp:
        problems.append(f"{shape.num_heads} attention heads are not divisible by tensor parallel size {tp}")
    if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        problems.append(
            f"{shape.num_kv_heads} key/value heads are neither a multiple nor a divisor of tensor "
            f"parallel size {tp}"
        )
    if shape.ffn_hidden_size % tp:
        problems.append(f"MLP size {shape.ffn_hidden_size} is not divisible by tensor parallel size {tp}")
    if shape.num_layers % pp:
        problems.append(f"{shape.num_layers} layers are not divisible by pipeline parallel size {pp}")
    if cp > 1 and not transformer_engine:
        problems.append(
            f"context parallel size {cp} needs TransformerEngine attention; the local layer spec supports 1"
        )
    problems += _expert_problems(shape, tp=tp, cp=cp, dp=dp, ep=ep)
    if problems:
        raise ValueError(f"parallelism does not fit {shape.architecture}: " + "; ".join(problems))
    return Parallelism(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep)


def _expert_problems(shape: ModelShape, *, tp: int, cp: int, dp: int, ep: int) -> list[str]:
    """Expert parallelism's rules. megatron-core 0.16.1 (``initialize_model_parallel``) needs the world
    size divisible by expert tensor x expert x pipeline sizes; we pass expert tensor parallel size 1,
    so ``ep`` must divide tp * cp * dp. Each EP rank holds num_experts / ep whole experts. MoE layers
    with tp > 1 need sequence parallelism, not yet supported with MoE models (their routers would see
    each rank's slice of the sequence, untested)."""
    moe = shape.moe
    field = "training.parallelism.expert"
    if moe is None:
        dense = f"{field} {ep} needs an MoE model ({shape.architecture} has no experts): set it to 1"
        return [dense] if ep > 1 else []
    problems = []
    if moe.num_experts % ep:
        problems.append(f"{moe.num_experts} experts are not divisible by {field} {ep}")
    if (tp * cp * dp) % ep:
        problems.append(
            f"{field} {ep} does not divide tensor {tp} x context {cp} x data {dp} = "
            f"{tp * cp * dp} (the ranks of a pipeline stage)"
        )
    if tp > 1:
        problems.append(
            f"tensor parallel size {tp} with {moe.num_experts} experts needs sequence parallelism, "
            "not supported yet with MoE models: set training.parallelism.tensor to 1"
        )
    return problems
