"""Token log-probs and entropy from logits, computed the same way by every trainer backend."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, T, V] logits (already aligned so logits[:, t] predicts tokens[:, t]) -> [B, T] log-probs.

    Divide by the rollout temperature so the trainer scores tokens under the distribution they
    were sampled from.
    """
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, T, V] -> [B, T] entropy of the softmax: logsumexp(z) - sum(p * z)."""
    logits = logits.float() / temperature
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)
