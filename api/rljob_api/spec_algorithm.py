"""The RL algorithm: advantage estimator, policy loss, KL, importance sampling, dynamic sampling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from .base import ApiModel, section
from .rules import Rule

AdvantageEstimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]


class TISSpec(ApiModel):
    """Truncated importance sampling: corrects for the gap between rollout and training log-probs."""

    rules = (
        Rule(
            cel="self.clipLow < self.clipHigh",
            message="clipLow must be below clipHigh",
            field=".clipLow",
            check=lambda t: t.clip_low < t.clip_high,
        ),
    )

    enabled: bool = Field(
        default=False,
        description="Weight the loss by clamp(exp(train_logp - rollout_logp), clipLow, clipHigh).",
    )
    clip_low: float = Field(default=0.0, ge=0.0, description="Lower clamp of the importance weight.")
    clip_high: float = Field(default=2.0, gt=0.0, description="Upper clamp of the importance weight.")


class DynamicSamplingSpec(ApiModel):
    """Over-sample prompts and keep only groups that carry a learning signal (DAPO)."""

    enabled: bool = Field(
        default=False,
        description="Drop groups whose rewards all equal each other (zero variance) and keep sampling until "
        "rollout.batchSize groups remain; the rest of the over-sampled requests are aborted.",
    )
    over_sampling_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1048576,
        description="Prompts submitted in the first sampling round (at least rollout.batchSize; defaults to it); "
        "later rounds submit the shortfall divided by the observed keep rate, at most this many.",
    )
    max_rounds: int = Field(
        default=8, ge=1, le=1000, description="Sampling rounds per step before training on what was kept."
    )


class CriticSpec(ApiModel):
    """The value model of advantageEstimator ppo (the others refuse it set)."""

    path: str | None = Field(
        default=None, max_length=4096, description="Initial critic weights; defaults to model.path."
    )
    lr: float = Field(default=1e-5, gt=0.0, le=1.0, description="Critic learning rate.")
    value_clip: float = Field(default=0.2, gt=0.0, le=10.0, description="Clip range of the value loss.")


_RETURNS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
_GROUP = ("grpo", "gspo")
_DEFAULT_CRITIC = {"path": None, "lr": 1e-5, "valueClip": 0.2}  # as model_dump names them

# Fields that only some estimators read: (field as written, the CEL test that it is at its default,
# the Python one, the estimators that read it, what it is). Set away from its default under another
# estimator, it would be accepted and ignored; it is refused instead, naming the estimators that use it.
ESTIMATOR_FIELDS: tuple[tuple[str, str, Callable[[AlgorithmSpec], bool], tuple[str, ...], str], ...] = (
    ("klCoef", "self.klCoef == 0.0", lambda a: a.kl_coef == 0.0, _RETURNS, "KL reward shaping"),
    ("gamma", "self.gamma == 1.0", lambda a: a.gamma == 1.0, _RETURNS, "the discount of the returns"),
    ("lambda", "self.lambda == 1.0", lambda a: a.lam == 1.0, ("ppo",), "GAE's lambda"),
    (
        "critic",
        "!has(self.critic.path) && self.critic.lr == 0.00001 && self.critic.valueClip == 0.2",
        lambda a: a.critic.model_dump() == _DEFAULT_CRITIC,
        ("ppo",),
        "the value model",
    ),
    (
        "normalizeGroupStd",
        "self.normalizeGroupStd",
        lambda a: a.normalize_group_std,
        _GROUP,
        "division by the group's reward std",
    ),
)


def _estimator_field_rule(
    name: str,
    default_cel: str,
    at_default: Callable[[AlgorithmSpec], bool],
    users: tuple[str, ...],
    what: str,
) -> Rule:
    users_cel = "[" + ", ".join(f"'{u}'" for u in users) + "]"
    said = " and ".join([", ".join(users[:-1]), users[-1]]) if len(users) > 1 else users[0]
    return Rule(
        cel=f"self.advantageEstimator in {users_cel} || ({default_cel})",
        message=f"algorithm.{name} ({what}) is used by advantageEstimator {said} only: leave it at its "
        "default with this estimator, or choose one that uses it",
        field=f".{name}",
        check=lambda a: a.advantage_estimator in users or at_default(a),
    )


class AlgorithmSpec(ApiModel):
    """Advantages and the policy loss."""

    rules = (
        Rule(
            cel="!has(self.epsClipHigh) || self.epsClipHigh >= self.epsClip",
            message="epsClipHigh must be at least epsClip",
            field=".epsClipHigh",
            check=lambda a: a.eps_clip_high is None or a.eps_clip_high >= a.eps_clip,
        ),
        Rule(
            cel="!self.useKLLoss || self.klLossCoef > 0.0",
            message="useKLLoss is true but klLossCoef is 0: set klLossCoef (e.g. 0.001) or useKLLoss false",
            field=".klLossCoef",
            check=lambda a: not a.use_kl_loss or a.kl_loss_coef > 0,
        ),
        *(_estimator_field_rule(*args) for args in ESTIMATOR_FIELDS),
    )

    advantage_estimator: AdvantageEstimator = Field(
        default="grpo",
        description="grpo: reward minus group mean (over group std unless normalizeGroupStd is false); "
        "gspo: GRPO advantages with a sequence-level ratio; reinforce_plus_plus: discounted returns with a "
        "per-token KL penalty, whitened over the batch; reinforce_plus_plus_baseline: the same with the group "
        "mean as baseline; ppo: GAE with a critic (see critic).",
    )
    normalize_group_std: bool = Field(
        default=True, description="grpo/gspo: divide by the group's reward std (false gives Dr. GRPO)."
    )
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount for reinforce_plus_plus and ppo.")
    lam: float = Field(default=1.0, ge=0.0, le=1.0, alias="lambda", description="GAE lambda for ppo.")
    eps_clip: float = Field(
        default=0.2, gt=0.0, le=10.0, description="Lower PPO clip range of the ratio: 1 - epsClip."
    )
    eps_clip_high: float | None = Field(
        default=None,
        gt=0.0,
        le=10.0,
        description="Upper clip range, 1 + epsClipHigh (clip-higher, e.g. 0.28); defaults to epsClip.",
    )
    eps_clip_c: float | None = Field(
        default=None,
        gt=1.0,
        le=100.0,
        description="Dual-clip constant c (> 1) bounding the loss for negative advantages; unset disables it.",
    )
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight of the entropy bonus.")
    use_kl_loss: bool = Field(
        default=False,
        alias="useKLLoss",
        description="Add klLossCoef * KL(policy || reference) to the loss (needs a frozen reference model).",
    )
    kl_loss_coef: float = Field(default=0.0, ge=0.0, le=100.0, description="Weight of the KL loss.")
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = Field(
        default="low_var_kl",
        description="KL estimator: k1 = log-ratio, k2 = squared log-ratio / 2, k3 = exp(-r) - 1 + r, "
        "low_var_kl = k3 clamped to [-10, 10].",
    )
    kl_coef: float = Field(
        default=0.0,
        ge=0.0,
        le=100.0,
        description="KL reward shaping: subtract klCoef * KL from the per-token reward (reinforce_plus_plus, ppo).",
    )
    loss_reduction: Literal["sample", "token"] = Field(
        default="sample",
        description="sample: mean over each sample's tokens, then over samples; token: mean over all tokens "
        "of the batch (long responses weigh more).",
    )
    tis: TISSpec = section(TISSpec, "Truncated importance sampling against the rollout log-probs.")
    dynamic_sampling: DynamicSamplingSpec = section(
        DynamicSamplingSpec, "Over-sampling and zero-variance group filtering."
    )
    critic: CriticSpec = section(CriticSpec, "Critic for advantageEstimator ppo.")
