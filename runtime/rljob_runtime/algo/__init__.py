"""The RL algorithm shared by every trainer backend: advantages, losses, KL estimators, dynamic sampling."""

from .advantages import Advantages, compute_advantages
from .batching import micro_batch_slices, optimizer_step_slices, steps_per_rollout, trainable_groups
from .dynamic_sampling import DynamicSampler, filter_groups, has_signal
from .kl import kl_estimate
from .logprobs import entropy_from_logits, token_logprobs
from .losses import policy_loss, value_loss
from .masked import masked_explained_variance, masked_mean, masked_whiten, reduce_loss

__all__ = [
    "Advantages",
    "DynamicSampler",
    "compute_advantages",
    "entropy_from_logits",
    "filter_groups",
    "has_signal",
    "kl_estimate",
    "masked_explained_variance",
    "masked_mean",
    "masked_whiten",
    "micro_batch_slices",
    "optimizer_step_slices",
    "policy_loss",
    "reduce_loss",
    "steps_per_rollout",
    "token_logprobs",
    "trainable_groups",
    "value_loss",
]
