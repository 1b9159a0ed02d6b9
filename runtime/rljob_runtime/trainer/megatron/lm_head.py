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
ColumnParallelLinear's input copy does). With sequence parallelism ``return_hidden_states`` gathers
the states' sequence first.

``chunked_token_stats`` gives the entropy of each token's softmax too (from the same chunks; its
gradient joins the log-probs' in one backward pass per chunk), and with ``fuse_wgrad`` accumulates the
weight's gradient straight into Megatron DDP's fp32 ``main_grad``, as Megatron's fused linear layers
do with gradient-accumulation fusion (training.fusions wgrad).

``return_hidden_states`` makes a GPTModel return its final hidden states instead of logits; with
``output_weight`` (the tied embedding or the output layer's own weight) that is this function's input.
``ChunkedHead`` / ``chunked_head`` hold one model's weight, TP group and fusion for ``schedule.token_stats``
(training.lmHead chunked: the response tokens' log-probs and entropy in both the log-prob pass and the
training forward) and for the MFU benchmark.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
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
    logp, _ = chunked_token_stats(
        hidden,
        weight,
        targets,
        vocab_size=vocab_size,
        temperature=temperature,
        group=group,
        chunk_bytes=chunk_bytes,
    )
    return logp


def chunked_token_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    group: dist.ProcessGroup | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    entropy: bool = False,
    fuse_wgrad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``chunked_token_logprobs`` and, with ``entropy``, the entropy of each token's softmax
    (logsumexp(z) - sum(p * z), z = logits / temperature), both fp32 of the leading shape and both
    differentiable in hidden and weight (each chunk's backward takes both upstream gradients at once).

    ``fuse_wgrad``: Megatron's gradient-accumulation fusion for the head's weight, as its fused linear
    layers do it (the model's ``gradient_accumulation_fusion``): backward accumulates each chunk's weight
    gradient straight into ``weight.main_grad`` (fp32, Megatron DDP's) and hands autograd a placeholder
    DDP's hook skips (zeros for a tied weight, whose hook adds it to the embedding's own gradient).
    Without it the weight gradient is summed over chunks in fp32 and rounded once to the weight's dtype."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree")
    if fuse_wgrad and not hasattr(weight, "main_grad"):
        raise ValueError("fuse_wgrad needs the weight's main_grad (a model under Megatron DDP)")
    lead = targets.shape
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, ent = _ChunkedStats.apply(
        flat,
        weight,
        targets.reshape(-1),
        vocab_size,
        float(temperature),
        group,
        chunk_tokens(weight.shape[0], chunk_bytes),
        entropy,
        fuse_wgrad,
    )
    return logp.reshape(lead), ent.reshape(lead) if entropy else None


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


class _ChunkedStats(torch.autograd.Function):
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
        entropy: bool,
        fuse_wgrad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)  # an unused output (entropy as a metric) costs backward nothing
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
        # the entropy per token (for its value and gradient); empty without entropy
        ent = torch.empty(n if entropy else 0, dtype=torch.float32, device=hidden.device)
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            z = _chunk_logits(hidden[rows], weight, n_valid, temperature)
            target = z.gather(1, local[rows, None]).squeeze(1)
            picked[rows] = torch.where(mine[rows], target, 0.0)
            peak = z.max(dim=1).values
            _all_reduce(peak, dist.ReduceOp.MAX, group, size)
            z.sub_(peak[:, None])  # d = z - peak <= 0; padding stays -inf
            e = z.exp()
            sums = e.sum(dim=1, keepdim=True)
            if entropy:
                # sum of e * d over the real columns (padding: e = 0 but d = -inf), beside sum e
                valid = slice(0, n_valid)
                sums = torch.cat([sums, e[:, valid].mul_(z[:, valid]).sum(dim=1, keepdim=True)], dim=1)
            del e, z
            _all_reduce(sums, dist.ReduceOp.SUM, group, size)
            log_sum = sums[:, 0].log()
            lse[rows] = peak + log_sum
            if entropy:  # H = lse - E[z] = log S - E[d]: the peak cancels before rounding
                ent[rows] = log_sum - sums[:, 1] / sums[:, 0]
        _all_reduce(picked, dist.ReduceOp.SUM, group, size)
        ctx.save_for_backward(hidden, weight, local, mine, lse, ent)
        ctx.meta = (n_valid, temperature, group, size, chunk, fuse_wgrad)
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return picked - lse, ent

    @staticmethod
    def backward(
        ctx: Any, grad_logp: torch.Tensor | None, grad_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        from .fusions import wgrad_accumulate

        hidden, weight, local, mine, lse, ent = ctx.saved_tensors
        n_valid, temperature, group, size, chunk, fuse_wgrad = ctx.meta
        # dlogits = dz / temperature; both upstream gradients scaled once
        g = torch.zeros_like(lse) if grad_logp is None else grad_logp.float() / temperature
        g_ent = None if grad_ent is None or not ent.numel() else grad_ent.float() / temperature
        mean_z = lse - ent if g_ent is not None else None  # E[z]
        grad_hidden = torch.empty_like(hidden)
        if fuse_wgrad:
            grad_weight = weight.main_grad  # what Megatron's fused linear accumulates into
        else:
            # fp32 accumulation over chunks, as Megatron's main_grad accumulates a linear's weight grad
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for i in range(0, hidden.shape[0], chunk):
            rows = slice(i, i + chunk)
            z = _chunk_logits(hidden[rows], weight, n_valid, temperature)
            p = z.sub(lse[rows, None]).exp_()  # softmax; padding columns exp(-inf) = 0
            if g_ent is None:
                # d log p(t) / d z = onehot(t) - p
                dz = p.mul_(-g[rows, None])
            else:
                # d H / d z = -p (z - E[z]); with the log-prob's -p: -p (g + g_ent (z - E[z]))
                if n_valid < z.shape[1]:
                    z[:, n_valid:] = 0.0  # finite where p is 0, so 0 * (z - E[z]) stays 0
                assert mean_z is not None
                coef = z.sub_(mean_z[rows, None]).mul_(g_ent[rows, None]).add_(g[rows, None])
                dz = p.mul_(coef).neg_()
            del z
            # the onehot term, added where this rank holds the target (elsewhere 0 goes to column 0;
            # a scatter, not a boolean index, so no host sync per chunk)
            onehot = torch.where(mine[rows], g[rows], 0.0)
            dz = dz.scatter_add_(1, local[rows, None], onehot[:, None]).to(hidden.dtype)
            grad_hidden[rows] = dz @ weight
            wgrad_accumulate(hidden[rows], dz, grad_weight)
        _all_reduce(grad_hidden, dist.ReduceOp.SUM, group, size)
        if fuse_wgrad:
            weight.grad_added_to_main_grad = True
            # A placeholder so DDP's hook on the weight still runs (its bucket's reduce waits for it):
            # zeros for a tied weight (the hook adds it), otherwise left unread, as Megatron's linears.
            tied = getattr(weight, "zero_out_wgrad", False)
            make = torch.zeros if tied else torch.empty
            return grad_hidden, make(weight.shape, dtype=weight.dtype, device=weight.device), *([None] * 7)
        return grad_hidden, grad_weight.to(weight.dtype), *([None] * 7)


# ------------------------------------------------------------------------------ GPTModel glue


def output_weight(gpt_model: Any) -> torch.Tensor:
    """The weight a GPTModel's logits come from: the tied embedding, or the output layer's own."""
    if gpt_model.share_embeddings_and_output_weights:
        return gpt_model.shared_embedding_or_output_weight()
    return gpt_model.output_layer.weight


def return_hidden_states(gpt_model: Any) -> None:
    """Make ``gpt_model`` (called without labels) return its final hidden states [b, s, h] (after
    the final norm) where it returned logits: its output layer becomes the identity. The layer and its
    weight stay (same parameter names, checkpoints and weight sync unchanged).

    With sequence parallelism each tensor-parallel rank holds a slice of the sequence: the states are
    gathered whole, as the output layer's input is, and in backward each rank keeps its slice of their
    gradient, which is whole on every rank already (the chunked head all-reduces it over TP; a critic's
    replicated value head computes it from the whole states)."""
    if gpt_model.config.sequence_parallel:
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        def identity(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, None]:
            return gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False
            ), None

    else:

        def identity(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, None]:
            return hidden_states, None

    gpt_model.output_layer.forward = types.MethodType(identity, gpt_model.output_layer)


@dataclass(frozen=True)
class ChunkedHead:
    """The chunked head of one GPTModel's last pipeline stage (``return_hidden_states`` made it return
    hidden states): its output weight, the tensor-parallel group its vocabulary rows are split over
    (None at tensor parallel 1) and whether backward accumulates the weight's gradient into its
    ``main_grad`` (the model's ``gradient_accumulation_fusion``, under Megatron DDP)."""

    weight: torch.Tensor
    group: dist.ProcessGroup | None = None
    fuse_wgrad: bool = False
    chunk_bytes: int = CHUNK_BYTES

    def __call__(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        *,
        vocab_size: int,
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``chunked_token_stats`` of hidden [..., h] and targets [...] with this head's weight."""
        return chunked_token_stats(
            hidden,
            self.weight,
            targets,
            vocab_size=vocab_size,
            temperature=temperature,
            group=self.group,
            chunk_bytes=self.chunk_bytes,
            entropy=entropy,
            fuse_wgrad=self.fuse_wgrad,
        )


def chunked_head(
    gpt_model: Any, group: dist.ProcessGroup | None = None, *, chunk_bytes: int = CHUNK_BYTES
) -> ChunkedHead:
    """``gpt_model``'s output layer as a ``ChunkedHead`` (call ``return_hidden_states`` on it too):
    its output weight, the weight-gradient fusion when its config asks for it and the weight is under
    Megatron DDP (it has a ``main_grad``; wrap the model first)."""
    weight = output_weight(gpt_model)
    fuse = bool(gpt_model.config.gradient_accumulation_fusion) and hasattr(weight, "main_grad")
    return ChunkedHead(weight, group, fuse_wgrad=fuse, chunk_bytes=chunk_bytes)
