"""Partial rollout's carry-over: the groups still generating when a dynamic-sampling step had its
batch. Their requests were aborted; each sample keeps the tokens and log-probs it had (and the weight
version of each token), and the groups are continued first in the next step, those nearest completion
first. Saved with every checkpoint, so a resumed run continues them too."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from .data.sample import Sample, Status

FINISHED = (Status.COMPLETED, Status.TRUNCATED)


def unfinished(group: list[Sample]) -> list[Sample]:
    """The samples of a group that still need generation (fresh, or aborted part-way)."""
    return [s for s in group if s.status not in FINISHED]


def _tokens_to_go(group: list[Sample]) -> int:
    """How far a group is from done, as a sort key: minus the tokens of its least advanced unfinished
    sample (samples decode in parallel, so that one sets the group's finish; all share one length cap)."""
    todo = unfinished(group)
    return -min(len(s.response_ids) for s in todo) if todo else -(1 << 62)


class CarriedGroups:
    """Carried groups (one prompt's samples each); thread-safe (async mode's rollouts are made on a
    thread of their own while the driver checkpoints)."""

    def __init__(self) -> None:
        self._groups: list[list[Sample]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, groups: Iterable[list[Sample]]) -> None:
        for group in groups:
            for sample in group:
                sample.reward = None  # scored again once the whole group is done
            with self._lock:
                self._groups.append(group)

    def take(self, most: int) -> list[list[Sample]]:
        """Up to ``most`` groups, nearest completion first, then oldest first. Engines serve requests
        in arrival order, so these finish first and are trained first: their tokens are the stalest
        (in arrival order, groups aborted while still queued came back first and went ahead of
        half-generated ones, which then drifted further behind the trainer)."""
        with self._lock:
            ranked = sorted(self._groups, key=_tokens_to_go)  # stable: oldest first among equals
            out = ranked[:most]
            self._groups = ranked[most:]
        return out

    def tokens(self) -> int:
        """Response tokens carried (already generated, not generated again)."""
        with self._lock:
            return sum(len(s.response_ids) for group in self._groups for s in group)

    def state_dict(self) -> list[list[dict[str, Any]]]:
        with self._lock:
            return [[s.to_dict() for s in group] for group in self._groups]

    def load_state_dict(self, state: list[list[dict[str, Any]]]) -> None:
        with self._lock:
            self._groups = [[Sample.from_dict(d) for d in group] for group in state]
