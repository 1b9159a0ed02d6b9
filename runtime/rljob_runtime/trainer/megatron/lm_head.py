"""Chunked LM head: per-token log p(target) straight from the last hidden states and the (vocab-
parallel) output weight, never holding the [tokens, vocab] logits.

With a 151,936-token vocabulary one 4,096-token sequence has 1.2 GiB of bf16 logits, and the
cross-entropy behind them keeps fp32 copies and their gradient (about 6 GiB at the loss): what
stops a 4B model with full Adam state from training on one 80 GB GPU. Here the logits exist one
chunk of tokens at a time, in fp32; backward recomputes each chunk's logits (one more GEMM of the
head, about 3 % of a 4B model's FLOPs) instead of keeping them.

Tensor parallel: each rank holds the vocabulary rows [rank * V_local, (rank + 1) * V_local) of the
weight (Megatron's ColumnParallelLinear layout) and the whole hidden states; the softmax statistics
and the target logit are all-reduced over ``group``, and so is the hidden states' gradient (what
ColumnParallelLinear's input copy does). Sequence parallelism is not supported.

``return_hidden_states`` makes a GPTModel return its final hidden states instead of logits; with
``output_weight`` (the tied embedding or the output layer's own weight) that is this function's input.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.distributed as dist

CHUNK_BYTES = 256 * 2**20  # one chunk's fp32 logits; backward holds about three of these


def chunk_tokens(vocab_local: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk: as many as keep one chunk's fp32 logits within ``chunk_bytes``."""
    return max(1, chunk_bytes // (4 * vocab_local))


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    group: dist.ProcessGroup | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature)[target] over the first ``vocab_size`` columns.

    hidden [..., h] (any leading shape), weight [V_local, h] (this rank's vocabulary rows; rows past
    ``vocab_size`` are padding and take no part), targets [...] global token ids < vocab_size.
    Returns fp32 log-probs of the leading shape; differentiable in hidden and weight."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree")
    lead = targets.shape
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp = _ChunkedLogprobs.apply(
        flat,
        weight,
        targets.reshape(-1),
        vocab_size,
        float(temperature),
        group,
        chunk_tokens(weight.shape[0], chunk_bytes),
    )
    return logp.reshape(lead)


def _tp(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, size) in the tensor-parallel group; (0, 1) without one."""
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_reduce(
    t: torch.Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None, size: int
) -> None:
    if size > 1:
        dist.all_reduce(t, op=op, group=group)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, n_valid: int, temperature: float) -> torch.Tensor:
    """fp32 [c, V_local] logits / temperature, padding columns at -inf."""
    z = (h @ weight.t()).float()
    if temperature != 1.0:
        z.div_(temperature)
    if n_valid < z.shape[1]:
        z[:, n_valid:] = float("-inf")
    return z


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        vocab_size: int,
        temperature: float,
        group: dist.ProcessGroup | None,
        chunk: int,
    ) -> torch.Tensor:
        rank, size = _tp(group)
        v_local = weight.shape[0]
        start = rank * v_local
        n_valid = max(0, min(v_local, vocab_size - start))
        local = targets - start
        mine = (local >= 0) & (local < n_valid)
        local = torch.where(mine, local, 0)
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        picked = torch.empty_like(lse)
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            z = _chunk_logits(hidden[rows], weight, n_valid, temperature)
            peak = z.max(dim=1).values
            _all_reduce(peak, dist.ReduceOp.MAX, group, size)
            sum_exp = (z - peak[:, None]).exp_().sum(dim=1)
            _all_reduce(sum_exp, dist.ReduceOp.SUM, group, size)
            lse[rows] = peak + sum_exp.log()
            target = z.gather(1, local[rows, None]).squeeze(1)
            picked[rows] = torch.where(mine[rows], target, 0.0)
        _all_reduce(picked, dist.ReduceOp.SUM, group, size)
        ctx.save_for_backward(hidden, weight, local, mine, lse)
        ctx.meta = (n_valid, temperature, group, size, chunk)
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from .fusions import wgrad_accumulate

        hidden, weight, local, mine, lse = ctx.saved_tensors
        n_valid, temperature, group, size, chunk = ctx.meta
        g = grad_logp.float() / temperature
        grad_hidden = torch.empty_like(hidden)
        # fp32 accumulation over chunks, as Megatron's main_grad accumulates a linear's weight grad
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for i in range(0, hidden.shape[0], chunk):
            rows = slice(i, i + chunk)
            z = _chunk_logits(hidden[rows], weight, n_valid, temperature)
            # d log p(t) / d z = onehot(t) - softmax(z); padding columns: exp(-inf) = 0
            dz = z.sub_(lse[rows, None]).exp_().mul_(-g[rows, None])
            # the onehot term, added where this rank holds the target (elsewhere 0 goes to column 0;
            # a scatter, not a boolean index, so no host sync per chunk)
            onehot = torch.where(mine[rows], g[rows], 0.0)
            dz = dz.scatter_add_(1, local[rows, None], onehot[:, None]).to(hidden.dtype)
            grad_hidden[rows] = dz @ weight
            wgrad_accumulate(hidden[rows], dz, grad_weight)
        _all_reduce(grad_hidden, dist.ReduceOp.SUM, group, size)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


# ------------------------------------------------------------------------------ GPTModel glue


def output_weight(gpt_model: Any) -> torch.Tensor:
    """The weight a GPTModel's logits come from: the tied embedding, or the output layer's own."""
    if gpt_model.share_embeddings_and_output_weights:
        return gpt_model.shared_embedding_or_output_weight()
    return gpt_model.output_layer.weight


def return_hidden_states(gpt_model: Any) -> None:
    """Make ``gpt_model`` (called without labels) return its final hidden states [b, s, h] (after
    the final norm) where it returned logits: its output layer becomes the identity. The layer and its
    weight stay (same parameter names, checkpoints and weight sync unchanged)."""
    if gpt_model.config.sequence_parallel:
        raise ValueError("the chunked LM head does not support sequence parallelism")

    def identity(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, None]:
        return hidden_states, None

    gpt_model.output_layer.forward = types.MethodType(identity, gpt_model.output_layer)
