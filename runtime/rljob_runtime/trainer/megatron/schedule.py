"""The pieces of ``MegatronTrainerRank``'s forward/backward passes: Megatron's pipeline schedule over
micro-batches, per-token log-probs and entropy from (vocab-padded) logits, and metric reduction
(computed on the last pipeline stage, then shared with the other stages)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from ...algo.logprobs import entropy_from_logits, token_logprobs
from ..base import Metrics, TrainBatch
from ..rank_base import SUMMED_METRICS

LossFn = Callable[[TrainBatch, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]


def token_stats(
    logits: torch.Tensor, mb: TrainBatch, vocab_size: int, temperature: float, entropy: str | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[b, T] log-probs of the response tokens (logits / temperature, vocab padding dropped) and
    entropy: "grad", "metric" (no graph) or None."""
    device = logits.device
    logits = logits[..., :vocab_size]
    rows = torch.arange(mb.size, device=device)[:, None]
    picked = logits[rows, mb.logit_positions().to(device)]  # [b, T, V]
    valid = mb.response_mask().to(device) > 0
    logp = torch.where(valid, token_logprobs(picked, mb.response_ids.to(device), temperature), 0.0)
    ent = None
    if entropy == "grad":
        ent = torch.where(valid, entropy_from_logits(picked, temperature), 0.0)
    elif entropy == "metric":
        with torch.no_grad():
            ent = torch.where(valid, entropy_from_logits(picked.detach(), temperature), 0.0)
    return logp, ent


def run_schedule(
    model: Any,
    micro_batches: list[TrainBatch],
    loss_fn: LossFn,
    *,
    forward_only: bool,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Megatron's forward(-backward) schedule over the micro-batches; ``loss_fn(mb, logits)`` runs
    on the last pipeline stage. Returns its dicts there ([] elsewhere)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from .model import causal_mask

    def forward_step(data: Any, chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        mb = next(data)
        ids = mb.input_ids.to(device)
        b, s = ids.shape
        positions = torch.arange(s, device=device)[None].expand(b, s)
        return chunk(ids, positions, causal_mask(s, device)), partial(loss_fn, mb)

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(micro_batches),
        model=[model],
        num_microbatches=len(micro_batches),
        seq_length=max(int(mb.input_ids.shape[1]) for mb in micro_batches),
        micro_batch_size=micro_batches[0].size,
        forward_only=forward_only,
    )


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
