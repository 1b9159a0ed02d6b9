"""The reward interface shared by every reward type, and how a returned value becomes a float."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..sample import Sample


class RewardError(RuntimeError):
    """A reward that cannot be built or computed; the message names the reward and the cause."""


async def run_in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Await a blocking call in a daemon thread. Unlike asyncio.to_thread, a call that never returns
    cannot block asyncio.run's executor shutdown or interpreter exit after its timeout fired."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def deliver(ok: bool, value: Any) -> None:
        # RuntimeError: the loop is closed; the call outlived its timeout and nobody waits for it.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, ok, value)

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:
            deliver(False, exc)
        else:
            deliver(True, result)

    threading.Thread(target=work, name="reward", daemon=True).start()
    return await future


def reduce_result(result: Any, reward_key: str | None, where: str) -> float:
    """A float from a reward function's result: a number, or a dict read at reward_key (else 'reward')."""
    if isinstance(result, dict):
        key = reward_key or "reward"
        if key not in result:
            hint = "" if reward_key else " (set reward.rewardKey)"
            raise RewardError(f"{where}: returned a dict without key {key!r}{hint}; keys: {sorted(result)}")
        result = result[key]
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, int | float):
        return float(result)
    raise RewardError(f"{where}: returned {type(result).__name__} {result!r}; expected a number or a dict")


def scalar_reward(sample: Sample, reward_key: str | None = None) -> float:
    """The sample's reward as a float (a generate hook may have stored a dict)."""
    if sample.reward is None:
        raise RewardError(f"sample {sample.index} (group {sample.group_index}) has no reward")
    return reduce_result(sample.reward, reward_key, f"sample {sample.index} reward")


def store(sample: Sample, result: Any, reward_key: str | None, where: str) -> float:
    """Set sample.reward to the reduced float; a dict result is kept in metadata['reward_details']."""
    value = reduce_result(result, reward_key, where)
    if isinstance(result, dict):
        sample.metadata["reward_details"] = result
    sample.reward = value
    return value


class RewardFunction(ABC):
    """Scores samples in place. ``needs_label``: the data must carry a label (checked before training)."""

    name: str = "reward"
    needs_label: bool = False

    @abstractmethod
    async def score(self, samples: list[Sample]) -> list[float]:
        """Fill ``sample.reward`` for every sample and return the rewards in order."""


class RuleReward(RewardFunction):
    """A pure (response, label) -> float rule such as math or f1; cheap, so it runs inline."""

    needs_label = True

    def __init__(self, name: str, rule: Callable[[str, Any], float]) -> None:
        self.name = name
        self.rule = rule

    async def score(self, samples: list[Sample]) -> list[float]:
        out = []
        for s in samples:
            try:
                value = self.rule(s.response, s.label)
            except Exception as exc:
                raise RewardError(f"reward {self.name} failed on sample {s.index}: {exc!r}") from exc
            s.reward = value
            out.append(value)
        return out
