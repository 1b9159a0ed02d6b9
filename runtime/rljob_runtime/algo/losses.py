"""The policy loss (PPO clip, dual clip, GSPO sequence ratio, TIS, entropy, KL) and the PPO value loss.

Sign convention: losses are minimised; advantages > 0 make the token more likely. All inputs are
padded [batch, tokens] tensors over response tokens; ``loss_mask`` is 1 on trained tokens.
Metrics are detached 0-dim tensors so a GPU backend can aggregate them without a sync per term.
"""

from __future__ import annotations

import torch

from rljob_api.spec_algorithm import AlgorithmSpec

from .kl import kl_estimate
from .masked import Reduction, masked_mean, reduce_loss

Metrics = dict[str, torch.Tensor]


def log_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, loss_mask: torch.Tensor, sequence_level: bool
) -> torch.Tensor:
    """log(pi / pi_old) per token; GSPO: each sample's mean token log-ratio on all of its tokens."""
    lr = logp - old_logp.detach()
    if not sequence_level:
        return lr
    seq = masked_mean(lr, loss_mask, dim=-1)
    return seq[:, None].expand_as(lr)


def clipped_pg(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss max(-A r, -A clip(r, 1-eps, 1+eps_high)), dual-clipped to at most -A c for
    A < 0. Returns (loss, clipped: the clip was active, dual_clipped)."""
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    dual = torch.zeros_like(clipped)
    if eps_clip_c is not None:
        pg3 = -advantages * eps_clip_c
        dual = (advantages < 0) & (loss > pg3)
        loss = torch.where(advantages < 0, torch.minimum(loss, pg3), loss)
    return loss, clipped, dual


def tis_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weight clamp(exp(old_logp - rollout_logp), low, high), no gradient.
    Returns (weights, clipped) where clipped marks tokens whose weight the clamp changed."""
    raw = torch.exp((old_logp - rollout_logp).detach().float())
    weights = raw.clamp(clip_low, clip_high)
    return weights, weights != raw


def policy_loss(
    spec: AlgorithmSpec,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """loss = reduce(pg * tis) - entropyCoef * reduce(entropy) + klLossCoef * reduce(kl(logp, ref)).

    ``denominator``: the global batch's token (token reduction) or sample (sample reduction) count,
    for gradient accumulation over micro-batches; defaults to this batch's.
    """
    mask = loss_mask.to(logp.dtype)
    reduction = spec.loss_reduction
    eps_high = spec.eps_clip if spec.eps_clip_high is None else spec.eps_clip_high
    lr = log_ratio(logp, old_logp, mask, sequence_level=spec.advantage_estimator == "gspo")
    ratio = torch.exp(lr)
    pg, clipped, dual = clipped_pg(ratio, advantages.detach(), spec.eps_clip, eps_high, spec.eps_clip_c)
    metrics: Metrics = {}
    if rollout_logp is not None:
        # How far the trainer's log-probs of the sampled tokens are from the engine's: ~0 when the
        # engine serves the trainer's weights and computes as it does; stale or wrong weights, or a
        # sampling setting one side ignores (temperature), show here first.
        metrics["rollout_logp_abs_diff"] = masked_mean((old_logp - rollout_logp).abs().detach(), mask)
    if spec.tis.enabled:
        if rollout_logp is None:
            raise ValueError("algorithm.tis.enabled needs the rollout log-probs")
        weights, tis_clipped = tis_weights(old_logp, rollout_logp, spec.tis.clip_low, spec.tis.clip_high)
        pg = pg * weights
        metrics["tis_weight_mean"] = masked_mean(weights, mask).detach()
        metrics["tis_clipfrac"] = masked_mean(tis_clipped.float(), mask).detach()
    pg_loss = reduce_loss(pg, mask, reduction, denominator)
    loss = pg_loss
    metrics["pg_loss"] = pg_loss.detach()
    metrics["pg_clipfrac"] = masked_mean(clipped.float(), mask).detach()
    metrics["pg_dual_clipfrac"] = masked_mean(dual.float(), mask).detach()
    # Approximate KL(pi_old || pi) = E[-log ratio]; exactly 0 when logp == old_logp (on-policy).
    metrics["ppo_kl"] = masked_mean(-(logp - old_logp).detach(), mask)
    if entropy is not None:
        entropy_loss = reduce_loss(entropy, mask, reduction, denominator)
        metrics["entropy"] = entropy_loss.detach()
        if spec.entropy_coef:
            loss = loss - spec.entropy_coef * entropy_loss
    elif spec.entropy_coef:
        raise ValueError("algorithm.entropyCoef > 0 needs the per-token entropy")
    if spec.use_kl_loss:
        if ref_logp is None:
            raise ValueError("algorithm.useKLLoss needs the reference model's log-probs")
        kl_loss = reduce_loss(
            kl_estimate(logp, ref_logp.detach(), spec.kl_loss_type), mask, reduction, denominator
        )
        metrics["kl_loss"] = kl_loss.detach()
        loss = loss + spec.kl_loss_coef * kl_loss
    metrics["loss"] = loss.detach()
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    value_clip: float,
    reduction: Reduction = "token",
    denominator: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """0.5 * reduce(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)), the clipped PPO value loss."""
    mask = loss_mask.to(values.dtype)
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    unclipped_err = (values - returns).square()
    clipped_err = (clipped_values - returns).square()
    loss = 0.5 * reduce_loss(torch.maximum(unclipped_err, clipped_err), mask, reduction, denominator)
    metrics: Metrics = {
        "value_loss": loss.detach(),
        "value_clipfrac": masked_mean((clipped_err > unclipped_err).float(), mask).detach(),
        "value_mean": masked_mean(values.detach(), mask),
    }
    return loss, metrics
