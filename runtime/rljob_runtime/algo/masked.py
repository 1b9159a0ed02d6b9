"""Masked reductions over padded [batch, tokens] tensors (mask 1 = a trained response token)."""

from __future__ import annotations

from typing import Literal

import torch

Reduction = Literal["sample", "token"]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked elements; 0 where nothing is masked in (never NaN)."""
    return masked_sum(x, mask, dim) / mask.sum(dim if dim is not None else None).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked elements (population variance); masked-out stay 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).square(), mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def reduce_loss(
    x: torch.Tensor, mask: torch.Tensor, reduction: Reduction, denominator: float | None = None
) -> torch.Tensor:
    """Per-token values -> scalar.

    token:  sum(x * mask) / number of masked tokens
    sample: sum over samples of (mean of x over the sample's tokens) / number of samples with tokens
    ``denominator`` replaces the count (tokens or samples) with that of the whole global batch, so
    micro-batch losses summed under gradient accumulation equal the global-batch loss.
    """
    if reduction == "token":
        count = mask.sum().clamp(min=1) if denominator is None else denominator
        return masked_sum(x, mask) / count
    if reduction == "sample":
        per_sample = masked_sum(x, mask, dim=-1) / mask.sum(-1).clamp(min=1)
        count = (mask.sum(-1) > 0).sum().clamp(min=1) if denominator is None else denominator
        return per_sample.sum() / count
    raise ValueError(f"unknown loss reduction {reduction!r}; expected sample or token")


def masked_explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over masked elements: 1 is a perfect critic, 0 one that
    predicts the mean, negative worse than that; 0 when the returns do not vary."""
    mask = mask.float()
    var_returns = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
    if float(var_returns) <= 0.0:
        return 0.0
    err = returns - values
    var_err = masked_mean((err - masked_mean(err, mask)).square(), mask)
    return float(1.0 - var_err / var_returns)
