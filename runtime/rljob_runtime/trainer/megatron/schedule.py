"""The pieces of ``MegatronTrainerRank``'s forward/backward passes: Megatron's pipeline schedule over
micro-batches, per-token log-probs and entropy from (vocab-padded) logits, and metric reduction
(computed on the last pipeline stage, then shared with the other stages).

Packed micro-batches (training.dynamicBatch, ``TrainBatch.packed``) go through GPTModel as one
sequence [1, N] with megatron-core's ``PackedSeqParams`` (qkv_format "thd", the rows' cu_seqlens):
RoPE restarts per row (rope_utils' thd path) and ``attention.SdpaAttention`` attends within each
row only; the logits are then read at each row's packed positions."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from ...algo.logprobs import entropy_from_logits, token_logprobs
from ..base import Metrics, TrainBatch
from ..rank_base import SUMMED_METRICS
from .lm_head import ChunkedHead
from .routing_replay import RoutingReplay

LossFn = Callable[[TrainBatch, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]


def token_stats(
    logits: torch.Tensor,
    mb: TrainBatch,
    vocab_size: int,
    temperature: float,
    entropy: str | None,
    *,
    packed: bool = False,
    head: ChunkedHead | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[b, T] log-probs of the response tokens (logits / temperature, vocab padding dropped) and
    entropy: "grad", "metric" (no graph) or None. ``packed``: ``logits`` are [1, N, V] of the rows
    packed end to end (``run_schedule(packed=True)``), else [b, s, V] of the padded rows.

    ``head`` (training.lmHead chunked): ``logits`` are the model's last hidden states instead ([.., h],
    ``lm_head.return_hidden_states``), and the head computes the response tokens' log-probs and
    entropy from them a chunk of tokens at a time, never holding their logits."""
    device = logits.device
    if head is None:
        logits = logits[..., :vocab_size]
    valid = mb.response_mask().to(device) > 0  # [b, T]
    # Only the response tokens' logits are gathered ([n, V], n real response tokens): a [b, T, V]
    # gather would cost rows x the longest response x V, which in a packed micro-batch of many short
    # rows and one long one is many times the tokens it holds (a 1b at 8,192 tokens asked 23 GiB).
    if packed:
        picked = logits[0, mb.packed_logit_index().to(device)[valid]]
    else:
        rows = torch.arange(mb.size, device=device)[:, None].expand_as(valid)
        picked = logits[rows[valid], mb.logit_positions().to(device)[valid]]
    targets = mb.response_ids.to(device)[valid]

    def spread(values: torch.Tensor) -> torch.Tensor:  # [n] -> [b, T], 0 past each response
        return torch.zeros(valid.shape, dtype=values.dtype, device=device).masked_scatter(valid, values)

    if head is not None:
        # The entropy comes out of the same chunks; as a metric it is detached, so backward skips it.
        logp_n, ent_n = head(
            picked, targets, vocab_size=vocab_size, temperature=temperature, entropy=entropy is not None
        )
        ent = None
        if ent_n is not None:
            ent = spread(ent_n if entropy == "grad" else ent_n.detach())
        return spread(logp_n), ent
    logp = spread(token_logprobs(picked[None], targets[None], temperature)[0])
    ent = None
    if entropy == "grad":
        ent = spread(entropy_from_logits(picked[None], temperature)[0])
    elif entropy == "metric":
        with torch.no_grad():
            ent = spread(entropy_from_logits(picked.detach()[None], temperature)[0])
    return logp, ent


def model_inputs(
    mb: TrainBatch, device: torch.device, *, packed: bool, multiple: int = 1
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """GPTModel's arguments for micro-batch ``mb``: (input_ids, position_ids, attention_mask) and, packed,
    the rows end to end ([1, N]) with their ``PackedSeqParams`` (thd) and no mask (SdpaAttention reads
    the rows' bounds from the params); padded, [b, s] with Megatron's causal mask.

    ``multiple``: the sequence is padded to a multiple of it (sequence parallelism splits it over the
    tensor-parallel ranks): padded rows get more padding at their end, packed rows one more row of
    padding after the last. Either way no real token attends to it, and the logits are read at the
    real tokens' positions only."""
    if packed:
        from megatron.core.packed_seq_params import PackedSeqParams

        p = mb.packed().to(device)
        ids, positions, cu_seqlens, longest = p.input_ids, p.position_ids, p.cu_seqlens, p.max_seqlen
        if extra := -ids.shape[1] % multiple:
            ids = torch.nn.functional.pad(ids, (0, extra))
            positions = torch.cat(
                [positions, torch.arange(extra, device=device, dtype=positions.dtype)[None]], 1
            )
            cu_seqlens = torch.cat([cu_seqlens, cu_seqlens[-1:] + extra])
            longest = max(int(longest), extra)
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            max_seqlen_q=longest,
            max_seqlen_kv=longest,
        )
        return (ids, positions, None), {"packed_seq_params": params}
    from .model import causal_mask

    ids = mb.input_ids.to(device)
    if extra := -ids.shape[1] % multiple:
        ids = torch.nn.functional.pad(ids, (0, extra))
    b, s = ids.shape
    positions = torch.arange(s, device=device)[None].expand(b, s)
    return (ids, positions, causal_mask(s, device)), {}


def sequence_multiple(model: Any) -> int:
    """What the sequence length must be a multiple of: the tensor-parallel size under sequence
    parallelism (each rank takes an equal slice), else 1."""
    if not model.config.sequence_parallel:
        return 1
    from megatron.core import parallel_state as ps

    return int(ps.get_tensor_model_parallel_world_size())


def run_schedule(
    model: Any,
    micro_batches: list[TrainBatch],
    loss_fn: LossFn,
    *,
    forward_only: bool,
    device: torch.device,
    packed: bool = False,
    replay: RoutingReplay | None = None,
) -> list[dict[str, Any]]:
    """Megatron's forward(-backward) schedule over the micro-batches; ``loss_fn(mb, logits)`` runs
    on the last pipeline stage. Returns its dicts there ([] elsewhere). ``packed``: each micro-batch
    runs as its rows packed into one sequence (the module docstring). Shapes differ from one
    micro-batch to the next either way; the config's ``variable_seq_lengths`` has the pipeline
    stages send each activation's shape first. ``replay`` (training.routingReplay): each micro-batch's
    routing records are loaded into ``model``'s routers before its forward, and cleared at the end."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    multiple = sequence_multiple(model)

    def forward_step(data: Any, chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        mb = next(data)
        args, kwargs = model_inputs(mb, device, packed=packed, multiple=multiple)
        if replay is not None:
            replay.load(mb, device)
        return chunk(*args, **kwargs), partial(loss_fn, mb)

    def tokens(mb: TrainBatch) -> int:
        n = sum(mb.sequence_lengths()) if packed else int(mb.input_ids.shape[1])
        return n + -n % multiple

    try:
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[model],
            num_microbatches=len(micro_batches),
            seq_length=max(tokens(mb) for mb in micro_batches),
            micro_batch_size=1 if packed else micro_batches[0].size,
            forward_only=forward_only,
        )
    finally:
        if replay is not None:
            replay.clear()


def from_last_stage(obj: Any, pp: int) -> Any:
    """Results exist on the last pipeline stage: hand them to the other stages."""
    if pp == 1:
        return obj
    from megatron.core import parallel_state as ps

    box = [obj]
    dist.broadcast_object_list(
        box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
    )
    return box[0]


def reduce_metrics(sums: dict[str, torch.Tensor], group: Any, pp: int) -> Metrics:
    """SUMMED_METRICS added over data-parallel ranks, the others token-weighted means (as the torch
    backend reports them); computed on the last stage, then shared."""
    out: Metrics = {}
    if sums:
        keys = sorted(k for k in sums if k != "_tokens")
        packed = torch.stack([sums[k] for k in keys] + [sums["_tokens"]])
        dist.all_reduce(packed, group=group)
        tokens = max(float(packed[-1]), 1.0)
        for i, key in enumerate(keys):
            out[key] = float(packed[i]) if key in SUMMED_METRICS else float(packed[i]) / tokens
        out["tokens"] = float(packed[-1])
    return from_last_stage(out, pp)


def swap_entropy(
    collect: Callable[[TrainBatch, torch.Tensor, str | None], Any],
    entropy: str | None,
    mb: TrainBatch,
    logits: torch.Tensor,
) -> Any:
    return collect(mb, logits, entropy)


def accumulate(sums: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """One micro-batch's metrics: SUMMED_METRICS add up, the others are weighted by trained tokens."""
    n = mask.sum().double()
    sums["_tokens"] = sums.get("_tokens", torch.zeros((), dtype=torch.float64, device=n.device)) + n
    for key, value in metrics.items():
        value = value.detach().double()
        sums[key] = sums.get(key, 0.0) + (value if key in SUMMED_METRICS else value * n)
