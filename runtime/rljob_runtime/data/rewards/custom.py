"""A user's Python reward function 'pkg.mod:fn': sync or async, per sample or per group.

It is called as fn(sample) (or fn(samples) with group), or slime-style fn(args, sample) when it
takes two required positional parameters; args is then the RewardSpec.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable
from itertools import groupby
from typing import Any

from ..sample import Sample
from .base import RewardError, RewardFunction, run_in_daemon_thread, store


def import_function(
    path: str, *, field: str = "reward.function", error: type[Exception] = RewardError
) -> Callable[..., Any]:
    """The callable named by 'pkg.mod:fn'; errors (``error``) name ``field``, the path and what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{field} {path!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise error(f"{field} {path!r}: cannot import module {module_name!r}: {exc!r}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise error(f"{field} {path!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise error(f"{field} {path!r}: {attr!r} is a {type(fn).__name__}, not callable")
    return fn


def _wants_args(fn: Callable[..., Any], path: str) -> bool:
    """True for slime-style fn(args, sample); False for fn(sample)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]
    if len(required) > 2:
        raise RewardError(
            f"reward.function {path!r}: takes {len(required)} required arguments; expected 1 or 2"
        )
    return len(required) == 2


class CustomReward(RewardFunction):
    name = "custom"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        path: str,
        group: bool = False,
        reward_key: str | None = None,
        timeout: float | None = None,
        args: Any = None,
    ) -> None:
        self.fn = fn
        self.path = path
        self.group = group
        self.reward_key = reward_key
        self.timeout = timeout
        self.args = args
        self.wants_args = _wants_args(fn, path)

    async def _call(self, arg: Any) -> Any:
        call_args = (self.args, arg) if self.wants_args else (arg,)
        if inspect.iscoroutinefunction(self.fn):
            coro = self.fn(*call_args)
        else:  # sync functions run in a thread so a slow one does not block the event loop
            coro = run_in_daemon_thread(self.fn, *call_args)
        try:
            result = await asyncio.wait_for(coro, self.timeout)
        except TimeoutError as exc:
            raise RewardError(f"reward.function {self.path!r}: timed out after {self.timeout} s") from exc
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(f"reward.function {self.path!r} raised {exc!r}") from exc
        if inspect.isawaitable(result):  # a sync function that returned a coroutine
            result = await asyncio.wait_for(result, self.timeout)
        return result

    async def _one(self, sample: Sample) -> float:
        return store(sample, await self._call(sample), self.reward_key, f"reward.function {self.path!r}")

    async def _group(self, samples: list[Sample]) -> list[float]:
        results = await self._call(samples)
        if not isinstance(results, list | tuple) or len(results) != len(samples):
            got = len(results) if isinstance(results, list | tuple) else type(results).__name__
            raise RewardError(
                f"reward.function {self.path!r} (group): expected a list of {len(samples)} rewards, got {got}"
            )
        where = f"reward.function {self.path!r}"
        return [store(s, r, self.reward_key, where) for s, r in zip(samples, results, strict=True)]

    async def score(self, samples: list[Sample]) -> list[float]:
        if not self.group:
            return list(await asyncio.gather(*(self._one(s) for s in samples)))
        # Groups are runs of consecutive samples with the same group_index (how rollout batches are laid out).
        groups = [list(g) for _, g in groupby(samples, key=lambda s: s.group_index)]
        per_group = await asyncio.gather(*(self._group(g) for g in groups))
        return [r for rewards in per_group for r in rewards]
