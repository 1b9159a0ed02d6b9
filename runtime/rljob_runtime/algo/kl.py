"""Per-token KL estimators of KL(policy || reference) from log-probs of tokens sampled by the policy.

With x = logp - ref_logp (the log-ratio policy/reference):
  k1 = x                      unbiased, can be negative, high variance
  k2 = x^2 / 2                biased, non-negative, low variance
  k3 = exp(-x) - 1 + x        unbiased and non-negative (Schulman's estimator)
  low_var_kl = clamp(k3, -10, 10), x first clamped to [-20, 20] so exp cannot overflow
"""

from __future__ import annotations

from typing import Literal

import torch

KLType = Literal["k1", "k2", "k3", "low_var_kl"]


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLType) -> torch.Tensor:
    """Element-wise KL estimate (same shape as the inputs)."""
    x = logp - ref_logp
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x.square()
    if kind == "k3":
        return torch.exp(-x) - 1 + x
    if kind == "low_var_kl":
        x = x.clamp(-20.0, 20.0)
        return (torch.exp(-x) - 1 + x).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected k1, k2, k3 or low_var_kl")
