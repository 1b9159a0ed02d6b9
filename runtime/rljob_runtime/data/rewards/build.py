"""RewardSpec -> RewardFunction, validated up front so a bad spec fails before any rollout."""

from __future__ import annotations

from typing import Any

from rljob_api.spec_workload import RewardSpec

from .base import RewardError, RewardFunction, RuleReward
from .custom import CustomReward, import_function
from .dapo import dapo_reward
from .deepscaler import deepscaler_reward
from .math_answer import math_reward
from .remote import RemoteReward
from .text_match import exact_match_reward, f1_reward

RULES = {
    "math": math_reward,
    "dapo": dapo_reward,
    "deepscaler": deepscaler_reward,
    "exact_match": exact_match_reward,
    "f1": f1_reward,
}
TYPES = (*RULES, "remote", "custom")


def reward_needs_label(spec: RewardSpec) -> bool:
    """Whether the data must carry data.labelKey for this reward (rule-based rewards compare to it)."""
    return spec.type in RULES


def build_reward(spec: RewardSpec, *, args: Any = None) -> RewardFunction:
    """The reward function for ``spec``; ``args`` is passed to slime-style custom fn(args, sample)."""
    if spec.type in RULES:
        return RuleReward(spec.type, RULES[spec.type])
    if spec.type == "remote":
        if not spec.url:
            raise RewardError("reward.type remote needs reward.url")
        return RemoteReward(
            spec.url, timeout=spec.timeout_seconds, max_retries=spec.max_retries, reward_key=spec.reward_key
        )
    if spec.type == "custom":
        if not spec.function:
            raise RewardError("reward.type custom needs reward.function, e.g. 'my_rewards:score'")
        return CustomReward(
            import_function(spec.function),
            path=spec.function,
            group=spec.group,
            reward_key=spec.reward_key,
            timeout=spec.timeout_seconds,
            args=spec if args is None else args,
        )
    raise RewardError(f"reward.type {spec.type!r} is unknown; expected one of {', '.join(TYPES)}")
