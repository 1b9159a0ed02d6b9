"""Reward functions: rule-based (math, dapo, deepscaler, exact_match, f1), remote HTTP and custom Python."""

from .base import RewardError, RewardFunction, scalar_reward
from .build import build_reward, reward_needs_label

__all__ = ["RewardError", "RewardFunction", "build_reward", "reward_needs_label", "scalar_reward"]
