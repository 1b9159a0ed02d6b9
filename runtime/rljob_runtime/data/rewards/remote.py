"""Reward served over HTTP: POST the sample as JSON, read a number (or a dict) back; retried with
backoff, each attempt bounded by the timeout, so a dead server fails the step instead of hanging it."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

from ..sample import Sample
from .base import RewardError, RewardFunction, run_in_daemon_thread, store

PostFn = Callable[[str, dict[str, Any], float], Any]


def post_json(url: str, payload: dict[str, Any], timeout: float) -> Any:
    """Blocking POST of ``payload``; returns the decoded JSON body (HTTP errors raise)."""
    body = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode() or "null")


def reward_payload(sample: Sample) -> dict[str, Any]:
    """What a reward server receives: the sample as a dict, without its routing record (training.
    routingReplay: megabytes per response that no reward reads)."""
    out = sample.to_dict()
    out.pop("rollout_routed_experts", None)
    return out


class RemoteReward(RewardFunction):
    name = "remote"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        reward_key: str | None = None,
        concurrency: int = 64,
        backoff_seconds: float = 0.5,
        post: PostFn = post_json,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.max_retries = max_retries
        self.reward_key = reward_key
        self.concurrency = concurrency
        self.backoff_seconds = backoff_seconds
        self.post = post

    async def _one(self, sample: Sample, limit: asyncio.Semaphore) -> float:
        last: BaseException | None = None
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(min(self.backoff_seconds * 2 ** (attempt - 1), 10.0))
            try:
                async with limit:
                    # The outer wait_for also bounds DNS/connect stalls that urllib's timeout misses.
                    result = await asyncio.wait_for(
                        run_in_daemon_thread(self.post, self.url, reward_payload(sample), self.timeout),
                        self.timeout + 1.0,
                    )
                return store(sample, result, self.reward_key, f"remote reward {self.url}")
            except RewardError:
                raise  # a malformed answer will not improve on retry
            except Exception as exc:
                last = exc
        raise RewardError(
            f"remote reward {self.url} failed after {attempts} attempt(s) on sample {sample.index}: {last!r}"
        ) from last

    async def score(self, samples: list[Sample]) -> list[float]:
        limit = asyncio.Semaphore(self.concurrency)
        return list(await asyncio.gather(*(self._one(s, limit) for s in samples)))
