"""Which scored groups dynamic sampling keeps: the zero-reward-variance default (DAPO), or the user's
``rollout.customFilter`` (slime's ``--dynamic-sampling-filter-path``).

A filter takes one prompt's scored samples and answers keep or drop, with a reason for the drop that
the step's metrics count (``dynamic_sampling/dropped/<reason>``). A user's function may answer a
bool or ``(bool, reason)``, and may be ``async``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..data.rewards.base import scalar_reward
from ..data.rewards.custom import import_function
from ..data.sample import Sample
from .dynamic_sampling import has_signal

FIELD = "rollout.customFilter"
ZERO_VARIANCE = "zero_variance"
_REASON = re.compile(r"[^a-zA-Z0-9_]+")


class CustomFilterError(ValueError):
    """rollout.customFilter cannot be imported, or answered something that is not a verdict."""


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str = ""  # why a group was dropped: a metric name part


class GroupFilter:
    """``await filter(group)`` -> Verdict. Default: keep groups whose rewards differ."""

    def __init__(
        self,
        fn: Callable[[list[Sample]], Any] | None = None,
        path: str | None = None,
        *,
        reward_key: str | None = None,
    ) -> None:
        self._fn = fn
        self.path = path
        self._reward_key = reward_key

    async def __call__(self, group: list[Sample]) -> Verdict:
        if self._fn is None:
            rewards = [scalar_reward(s, self._reward_key) for s in group]
            return Verdict(True) if has_signal(rewards) else Verdict(False, ZERO_VARIANCE)
        answer = self._fn(group)
        if inspect.isawaitable(answer):
            answer = await answer
        return _verdict(answer, self.path or "")


def _verdict(answer: Any, path: str) -> Verdict:
    if isinstance(answer, bool):
        return Verdict(answer, "" if answer else "custom")
    if isinstance(answer, Sequence) and not isinstance(answer, str) and len(answer) == 2:
        keep, reason = answer
        if isinstance(keep, bool):
            name = _REASON.sub("_", str(reason)).strip("_")[:64] or "custom"
            return Verdict(keep, "" if keep else name)
    raise CustomFilterError(f"{FIELD} {path!r} answered {answer!r}; expected a bool or (bool, reason)")


def load_group_filter(path: str | None, *, reward_key: str | None = None) -> GroupFilter:
    """The filter for ``rollout.customFilter`` (``None``: the zero-variance default); import errors
    name the field and path, raised before anything starts."""
    if not path:
        return GroupFilter(reward_key=reward_key)
    fn = import_function(path, field=FIELD, error=CustomFilterError)
    try:
        inspect.signature(fn).bind(object())
    except TypeError as exc:
        raise CustomFilterError(
            f"{FIELD} {path!r}: cannot be called with one group of samples: {exc}"
        ) from exc
    except ValueError:  # no signature to inspect (a builtin): let the first call tell
        pass
    return GroupFilter(fn, path, reward_key=reward_key)
