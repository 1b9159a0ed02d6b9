"""Dynamic sampling (DAPO): keep only groups whose rewards differ, over-sampling prompts until
rollout.batchSize groups are kept or maxRounds rounds have run. Pure bookkeeping; the rollout
driver submits the requests and aborts the ones still in flight once ``done``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rljob_api.spec_algorithm import DynamicSamplingSpec

G = TypeVar("G")  # a group: usually list[Sample]


def has_signal(rewards: Sequence[float]) -> bool:
    """False when every reward of the group equals the first (zero variance: zero GRPO advantage)."""
    return any(r != rewards[0] for r in rewards[1:])


@dataclass
class DynamicSampler(Generic[G]):
    """Per-step state. Call ``prompts_to_request`` / ``add_group`` until ``done``, then ``kept``."""

    target_groups: int  # rollout.batchSize
    over_sampling_batch_size: int
    max_rounds: int
    enabled: bool = True
    rounds: int = 0
    seen: int = 0
    dropped: int = 0
    dropped_by: dict[str, int] = field(default_factory=dict)  # reason -> groups dropped for it
    kept_groups: list[G] = field(default_factory=list)

    @classmethod
    def from_spec(cls, spec: DynamicSamplingSpec, rollout_batch_size: int) -> DynamicSampler[G]:
        over = spec.over_sampling_batch_size or rollout_batch_size
        return cls(rollout_batch_size, max(over, rollout_batch_size), spec.max_rounds, spec.enabled)

    @property
    def enough(self) -> bool:
        """Target reached: the driver aborts the requests still in flight."""
        return len(self.kept_groups) >= self.target_groups

    @property
    def done(self) -> bool:
        """No further round will start: enough groups, or out of rounds (one round when disabled).
        When out of rounds the driver still collects the last round, then trains on what was kept."""
        return self.enough or self.rounds >= (self.max_rounds if self.enabled else 1)

    def prompts_to_request(self) -> int:
        """Prompts to submit for the next round: 0 when done; the over-sampling batch first; later
        rounds the shortfall divided by the observed keep rate, between the shortfall and the
        over-sampling batch."""
        if self.done:
            return 0
        if not self.enabled:
            return self.target_groups
        need = self.target_groups - len(self.kept_groups)
        if self.seen == 0 or not self.kept_groups:
            return self.over_sampling_batch_size
        keep_rate = len(self.kept_groups) / self.seen
        return max(need, min(self.over_sampling_batch_size, math.ceil(need / keep_rate)))

    def start_round(self) -> int:
        """Count a round and return how many prompts it submits."""
        n = self.prompts_to_request()
        if n:
            self.rounds += 1
        return n

    def add_group(self, group: G, rewards: Sequence[float]) -> bool:
        """Offer a finished group under the zero-variance filter; returns whether it was kept."""
        signal = has_signal(rewards)
        return self.offer(group, keep=signal, reason="" if signal else "zero_variance")

    def offer(self, group: G, *, keep: bool, reason: str = "") -> bool:
        """Offer a finished group with a filter's verdict (ignored when dynamic sampling is off);
        returns whether it was kept. Groups beyond the target are not kept."""
        self.seen += 1
        if self.enough:
            return False
        if self.enabled and not keep:
            self.dropped += 1
            self.dropped_by[reason or "custom"] = self.dropped_by.get(reason or "custom", 0) + 1
            return False
        self.kept_groups.append(group)
        return True

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/rounds": float(self.rounds),
            "dynamic_sampling/groups_seen": float(self.seen),
            "dynamic_sampling/groups_dropped": float(self.dropped),
            "dynamic_sampling/groups_kept": float(len(self.kept_groups)),
            "dynamic_sampling/keep_rate": len(self.kept_groups) / self.seen if self.seen else 0.0,
            **{f"dynamic_sampling/dropped/{why}": float(n) for why, n in sorted(self.dropped_by.items())},
        }


def filter_groups(groups: Sequence[G], rewards: Sequence[Sequence[float]]) -> tuple[list[G], int]:
    """One-shot filter: the groups with a reward signal, and how many were dropped."""
    kept = [g for g, r in zip(groups, rewards, strict=True) if has_signal(r)]
    return kept, len(groups) - len(kept)
