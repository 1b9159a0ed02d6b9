"""The rollout side's errors (shared by the manager and its weight updates)."""

from __future__ import annotations


class RolloutError(RuntimeError):
    """The rollout side cannot go on."""


class EngineRestartsExhausted(RolloutError):
    """More engines died than faultTolerance.maxEngineRestarts allows."""


class WeightUpdateError(RolloutError):
    """An engine refused a weight update (not a dead engine: that one is replaced)."""


class EngineGone(Exception):
    """An engine did not answer (connection refused, timeout, 5xx): treat it as dead."""
