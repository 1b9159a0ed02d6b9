"""Advantage estimators on padded [batch, tokens] response tensors with a 0/1 loss mask.

Samples of one prompt are consecutive in the batch (group_size = nSamplesPerPrompt), as rollout
lays them out. Every function returns per-token advantages that are 0 on masked-out tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rljob_api.spec_algorithm import AlgorithmSpec

from .masked import masked_whiten

GROUP_STD_EPS = 1e-6


def group_normalize(rewards: torch.Tensor, group_size: int, normalize_std: bool = True) -> torch.Tensor:
    """[B] rewards -> reward minus its group's mean, over (group std + 1e-6) when normalize_std.

    The std is the sample std (Bessel-corrected, torch's default, as slime/verl use); a group of one
    sample has advantage 0.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=-1, keepdim=True)
    if normalize_std and group_size > 1:
        centered = centered / (grouped.std(dim=-1, keepdim=True) + GROUP_STD_EPS)
    return centered.view(-1)


def broadcast_to_tokens(per_sample: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: every response token of a sample gets the sample's value."""
    return per_sample[:, None] * loss_mask.to(per_sample.dtype)


def grpo_advantages(
    rewards: torch.Tensor, loss_mask: torch.Tensor, group_size: int, normalize_std: bool = True
) -> torch.Tensor:
    """GRPO (and GSPO, whose difference is the sequence-level ratio in the loss)."""
    return broadcast_to_tokens(group_normalize(rewards, group_size, normalize_std), loss_mask)


def token_rewards(
    rewards: torch.Tensor, loss_mask: torch.Tensor, kl: torch.Tensor | None, kl_coef: float
) -> torch.Tensor:
    """Per-token reward: -kl_coef * kl on every response token, plus the sample's reward on its last one."""
    mask = loss_mask.float()
    out = torch.zeros_like(mask) if kl is None or kl_coef == 0 else -kl_coef * kl.float() * mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1).values  # -1: no response token
    has = last >= 0
    rows = torch.nonzero(has).squeeze(1)
    out[rows, last[has]] += rewards.float()[has]
    return out


def discounted_returns(token_reward: torch.Tensor, loss_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t'} with t' the next response token: masked-out tokens (padding, tool
    output between turns) neither count as steps nor carry reward."""
    mask = loss_mask.float()
    if gamma == 1.0:
        return (token_reward * mask).flip(-1).cumsum(-1).flip(-1) * mask
    returns = torch.zeros_like(token_reward)
    running = torch.zeros_like(token_reward[:, 0])
    for t in range(token_reward.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t] > 0, token_reward[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns * mask


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> torch.Tensor:
    """REINFORCE++: discounted per-token returns with a KL penalty, whitened over all batch tokens."""
    returns = discounted_returns(token_rewards(rewards, loss_mask, kl, kl_coef), loss_mask, gamma)
    return masked_whiten(returns, loss_mask.float())


def reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_size: int,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean reward first, then as REINFORCE++."""
    baselined = group_normalize(rewards, group_size, normalize_std=False)
    return reinforce_plus_plus_advantages(baselined, loss_mask, kl, kl_coef, gamma)


def gae(
    token_reward: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE: delta_t = r_t + gamma V_{t'} - V_t, A_t = delta_t + gamma lam A_{t'} with t' the next
    response token (masked-out tokens are skipped); V after the last token is 0.

    Returns (advantages, returns = advantages + values), both zero on masked-out tokens.
    """
    mask = loss_mask.float()
    values = values.detach().float() * mask
    adv = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    next_value = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        live = mask[:, t] > 0
        delta = token_reward[:, t] + gamma * next_value - values[:, t]
        running = torch.where(live, delta + gamma * lam * running, running)
        next_value = torch.where(live, values[:, t], next_value)
        adv[:, t] = running
    return adv * mask, (adv + values) * mask


def ppo_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO: GAE advantages (whitened over the batch's tokens) and un-whitened returns for the critic."""
    adv, returns = gae(token_rewards(rewards, loss_mask, kl, kl_coef), values, loss_mask, gamma, lam)
    return masked_whiten(adv, loss_mask.float()), returns


@dataclass(frozen=True)
class Advantages:
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor | None = None  # [B, T], ppo only (the critic's target)


def compute_advantages(
    spec: AlgorithmSpec,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_size: int,
    *,
    kl: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> Advantages:
    """Dispatch on spec.advantage_estimator. ``kl`` is the per-token k1 estimate of the rollout policy
    against the reference (old_logp - ref_logp) used for klCoef reward shaping."""
    est = spec.advantage_estimator
    with torch.no_grad():
        if est in ("grpo", "gspo"):
            return Advantages(grpo_advantages(rewards, loss_mask, group_size, spec.normalize_group_std))
        if est == "reinforce_plus_plus":
            return Advantages(
                reinforce_plus_plus_advantages(rewards, loss_mask, kl, spec.kl_coef, spec.gamma)
            )
        if est == "reinforce_plus_plus_baseline":
            return Advantages(
                reinforce_plus_plus_baseline_advantages(
                    rewards, loss_mask, group_size, kl, spec.kl_coef, spec.gamma
                )
            )
        if est == "ppo":
            if values is None:
                raise ValueError("advantageEstimator ppo needs the critic's values")
            adv, ret = ppo_advantages(rewards, values, loss_mask, kl, spec.kl_coef, spec.gamma, spec.lam)
            return Advantages(adv, ret)
    raise ValueError(f"unknown advantageEstimator {est!r}")
