"""An MoE model's experts across its expert-parallel (EP) ranks (megatron-core 0.16.1, expert tensor
parallel size 1): SequentialMLP names a rank's experts by local index
(``decoder.layers.N.mlp.experts.local_experts.<i>.``); EP rank r holds the global experts
``r * per + i`` (``moe.local_experts``; ``moe.shard_experts`` gives a rank its block when loading).

- ``gather_experts``: the export's half, every EP rank's experts renamed to global indices, each once;
  ``exports_weights``: which ranks take part in that collective.
- ``mark_experts``: the experts are expert-parallel parameters at every EP size (own optimizer, own
  DDP buffers), so checkpoints reshard between EP sizes.
- ``even_micro_batches`` / ``dispatchable``: megatron-core's allgather token dispatcher (the one that
  runs without CUDA) all-gathers each MoE layer's tokens over the EP ranks, so their micro-batches
  must hold the same number of tokens; the alltoall one (GPUs) exchanges the counts first and needs
  nothing of the kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..base import TrainBatch
from .moe import MoEShape, local_experts

Tensors = dict[str, torch.Tensor]
LOCAL_EXPERTS = ".mlp.experts.local_experts."


def is_expert(name: str) -> bool:
    """Whether a Megatron parameter name is one expert's tensor (not the router)."""
    return LOCAL_EXPERTS in name


def renumber(name: str, offset: int) -> str:
    """An expert tensor's name with ``offset`` added to its expert index (local -> global)."""
    head, sep, rest = name.partition(LOCAL_EXPERTS)
    if not sep:
        raise ValueError(f"{name!r} is not an expert tensor")
    index, tail = rest.split(".", 1)
    return f"{head}{sep}{int(index) + offset}.{tail}"


def _layer(name: str) -> str:
    return name.partition(LOCAL_EXPERTS)[0]


def gather_experts(local: Mapping[str, torch.Tensor], moe: MoEShape, ep: int) -> Tensors:
    """This EP rank's expert tensors (local indices) -> every EP rank's under global indices. A
    collective of megatron-core's expert-parallel group (``ep`` ranks: each must hold the same local
    names, which SequentialMLP guarantees); one all-gather per MoE layer of its experts flattened."""
    if ep == 1:
        return dict(local)
    from megatron.core import parallel_state as ps

    group = ps.get_expert_model_parallel_group()
    per = len(local_experts(moe.num_experts, ep, 0))
    layers: dict[str, list[str]] = {}
    for name in sorted(local):
        layers.setdefault(_layer(name), []).append(name)
    out: Tensors = {}
    for names in layers.values():
        flat = torch.cat([local[n].reshape(-1) for n in names])
        parts = [torch.empty_like(flat) for _ in range(ep)]
        dist.all_gather(parts, flat, group=group)
        for rank, part in enumerate(parts):
            pieces = torch.split(part, [local[n].numel() for n in names])
            for name, piece in zip(names, pieces, strict=True):
                out[renumber(name, rank * per)] = piece.view_as(local[name])
    return out


def even_micro_batches(mbs: Sequence[TrainBatch], group: dist.ProcessGroup | None = None) -> list[TrainBatch]:
    """The micro-batches with each one's sequences right-padded (token 0, mask 0) to the longest of the
    EP ranks' micro-batches at the same place (``group``: megatron-core's expert-parallel group). The
    padding comes after every real token, so causal attention keeps it out of their logits, and the
    loss never reads it; an aux loss would count it. Every rank must plan as many micro-batches of as
    many rows (fixed micro-batch size): a ValueError on every rank otherwise, not a hang."""
    if group is None:
        from megatron.core import parallel_state as ps

        group = ps.get_expert_model_parallel_group()
    # MAX over the ranks of (n, -n) gives the largest and the smallest n at once.
    count = torch.tensor([len(mbs), -len(mbs)], dtype=torch.long)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    if int(count[0]) != -int(count[1]):
        raise ValueError(
            f"expert-parallel ranks plan {-int(count[1])} to {int(count[0])} micro-batches: the allgather "
            "token dispatcher needs the same number on every rank"
        )
    if not mbs:
        return []
    stats = torch.tensor([(mb.size, -mb.size, int(mb.input_ids.shape[1])) for mb in mbs], dtype=torch.long)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    if bool((stats[:, 0] != -stats[:, 1]).any()):
        raise ValueError(
            "expert-parallel ranks' micro-batches hold different numbers of rows: the allgather token "
            f"dispatcher needs equal ones (rows per micro-batch here: {[mb.size for mb in mbs]})"
        )
    return [_pad_tokens(mb, length) for mb, length in zip(mbs, stats[:, 2].tolist(), strict=True)]


def _pad_tokens(mb: TrainBatch, length: int) -> TrainBatch:
    extra = length - int(mb.input_ids.shape[1])
    if extra == 0:
        return mb
    return replace(
        mb, input_ids=F.pad(mb.input_ids, (0, extra)), attention_mask=F.pad(mb.attention_mask, (0, extra))
    )


def mark_experts(model: torch.nn.Module) -> int:
    """Mark every expert parameter as megatron-core's expert-parallel kind (``allreduce`` False) at any
    EP size; returns how many. megatron-core marks them only when EP > 1, so at EP 1 the experts join
    the dense parameters: one optimizer instead of a chain of dense + expert ones, whose checkpoint
    another EP size cannot read (its param groups differ). Marked, they live in DDP's
    ``expert_parallel_buffers`` at every EP size, reduced over the expert data-parallel group (the
    data-parallel one at EP 1) with the dense gradients' 1 / dp scaling. Before DDP wraps the model."""
    marked = 0
    for name, param in model.named_parameters():
        if is_expert(name):
            param.allreduce = False  # type: ignore[attr-defined]  # megatron-core's parameter attribute
            marked += 1
    return marked


def exports_weights(moe: bool) -> bool:
    """Whether this rank takes part in the HF export (``MegatronTrainerRank.device_weights``): data-
    parallel rank 0's replica, and for an MoE model the EP peers holding its other experts (expert
    data-parallel rank 0: with tensor parallel size 1, data-parallel ranks 0..ep-1)."""
    from megatron.core import parallel_state as ps

    if not moe:
        return bool(ps.get_data_parallel_rank() == 0)
    return bool(ps.get_expert_data_parallel_rank() == 0)


def dispatchable(mbs: list[TrainBatch], config: Any, ep: int) -> list[TrainBatch]:
    """A rank's micro-batches as the model's token dispatcher needs them (``config``: its
    TransformerConfig): with megatron-core's allgather one over several EP ranks, ``even_micro_batches``;
    as they are otherwise (dense models, EP 1, the alltoall dispatcher)."""
    if ep > 1 and getattr(config, "moe_token_dispatcher_type", None) == "allgather":
        return even_micro_batches(mbs)
    return mbs
