"""Tensor-parallel split/gather and pipeline stages of a Megatron GPTModel state dict, pure functions.

TP layout of the local spec (megatron-core 0.16.1):

- vocab parallel (embedding, output layer) and column parallel (linear_qkv): contiguous chunks of
  dim 0. The fused qkv is chunked as it is: with nkv >= tp each rank gets whole groups; with
  nkv < tp Megatron all-gathers the qkv output and picks its heads, so a plain chunk is still right.
- linear_fc1 (SwiGLU): each rank holds [gate_r; up_r], so gate and up are chunked separately.
- row parallel (linear_proj, linear_fc2): chunks of dim 1.
- norms: replicated.
- MoE (``moe.py``): the router is replicated; experts are never TP-split (expert tensor parallel size 1,
  ``model.init_model_parallel``; MoE with tp > 1 is refused), so they count as replicated here and an
  EP rank's block of them is ``moe.shard_experts``' business.

PP: stage s holds layers [s*n, (s+1)*n) (n = layers / pp) under *local* indices 0..n-1; the first
stage holds the embedding, the last the final norm and output layer (a copy of the embedding when
tied, which Megatron keeps in sync through its embedding group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from .arch import ModelShape
from .convert import MG_LAYER, Tensors

SplitKind = Literal["dim0", "dim1", "glu", "replicated"]

_DIM0 = ("embedding.word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")
_DIM1 = ("linear_proj.weight", "linear_fc2.weight")
_MOE_REPLICATED = ("mlp.router.weight", "mlp.shared_experts.gate_weight")
_EXPERTS = ".mlp.experts.local_experts."


def split_kind(name: str) -> SplitKind:
    """How the Megatron tensor ``name`` is split across TP ranks."""
    if name.endswith(_MOE_REPLICATED) or _EXPERTS in name:
        return "replicated"
    if name.endswith(_DIM0):
        return "dim0"
    if name.endswith(_DIM1):
        return "dim1"
    if name.endswith("linear_fc1.weight"):
        return "glu"
    if name.endswith(("layernorm.weight", "input_layernorm.weight")):
        return "replicated"
    raise KeyError(f"unknown Megatron tensor {name!r}")


def _chunk(tensor: torch.Tensor, tp: int, dim: int, name: str) -> tuple[torch.Tensor, ...]:
    if tensor.shape[dim] % tp:
        raise ValueError(f"{name}: dim {dim} of size {tensor.shape[dim]} does not split over {tp} TP ranks")
    return torch.chunk(tensor, tp, dim=dim)


def shard_tensor(name: str, tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """TP rank ``rank``'s slice of one whole tensor."""
    kind = split_kind(name)
    if kind == "replicated" or tp == 1:
        return tensor
    if kind == "glu":
        gate, up = _chunk(tensor, 2, 0, name)
        return torch.cat([_chunk(gate, tp, 0, name)[rank], _chunk(up, tp, 0, name)[rank]], dim=0)
    return _chunk(tensor, tp, 0 if kind == "dim0" else 1, name)[rank].contiguous()


def gather_tensor(name: str, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The whole tensor from every TP rank's slice (rank order); inverse of ``shard_tensor``."""
    kind = split_kind(name)
    if kind == "replicated" or len(parts) == 1:
        return parts[0]
    if kind == "glu":
        halves = [torch.chunk(p, 2, dim=0) for p in parts]
        return torch.cat([*(h[0] for h in halves), *(h[1] for h in halves)], dim=0)
    return torch.cat(list(parts), dim=0 if kind == "dim0" else 1)


def shard_tp(state: Mapping[str, torch.Tensor], tp: int, rank: int) -> Tensors:
    """Every tensor of ``state`` sliced for TP rank ``rank``."""
    if not 0 <= rank < tp:
        raise ValueError(f"TP rank {rank} out of range for tensor parallel size {tp}")
    return {name: shard_tensor(name, t, tp, rank) for name, t in state.items()}


def gather_tp(shards: Sequence[Mapping[str, torch.Tensor]]) -> Tensors:
    """Whole tensors from every TP rank's state dict (rank order)."""
    names = list(shards[0])
    for rank, shard in enumerate(shards[1:], start=1):
        if set(shard) != set(names):
            raise ValueError(f"TP rank {rank} holds different tensors than rank 0")
    return {name: gather_tensor(name, [s[name] for s in shards]) for name in names}


# ------------------------------------------------------------------------------------ pipeline


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """Global indices of the layers pipeline stage ``stage`` holds (uniform split)."""
    if num_layers % pp or not 0 <= stage < pp:
        raise ValueError(f"{num_layers} layers do not split into pipeline stage {stage} of {pp}")
    per = num_layers // pp
    return range(stage * per, (stage + 1) * per)


def _layer_of(name: str) -> tuple[int, str] | None:
    if not name.startswith("decoder.layers."):
        return None
    index, suffix = name[len("decoder.layers.") :].split(".", 1)
    return int(index), suffix


def to_stage(state: Mapping[str, torch.Tensor], shape: ModelShape, pp: int, stage: int) -> Tensors:
    """The whole model's tensors (global layer indices) -> pipeline stage ``stage``'s (local indices)."""
    layers = stage_layers(shape.num_layers, pp, stage)
    first, last = stage == 0, stage == pp - 1
    out: Tensors = {}
    for name, tensor in state.items():
        layer = _layer_of(name)
        if layer is not None:
            if layer[0] in layers:
                out[MG_LAYER.format(layer[0] - layers.start) + layer[1]] = tensor
        elif name == "embedding.word_embeddings.weight":
            if first:
                out[name] = tensor
            if last and not first and shape.tied_embeddings:
                out["output_layer.weight"] = tensor
        elif last:
            out[name] = tensor
    return out


def from_stage(state: Mapping[str, torch.Tensor], shape: ModelShape, pp: int, stage: int) -> Tensors:
    """Inverse of ``to_stage``: local layer indices -> global ones. A tied model's output-layer copy
    on the last stage is dropped (the embedding is the original)."""
    offset = stage_layers(shape.num_layers, pp, stage).start
    out: Tensors = {}
    for name, tensor in state.items():
        layer = _layer_of(name)
        if layer is not None:
            out[MG_LAYER.format(layer[0] + offset) + layer[1]] = tensor
        elif not (name == "output_layer.weight" and shape.tied_embeddings):
            out[name] = tensor
    return out
