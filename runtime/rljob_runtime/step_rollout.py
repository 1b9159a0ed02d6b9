"""One step's rollout: plain (rollout.batchSize prompts x nSamplesPerPrompt) or DAPO dynamic
sampling (rounds of over-sampled prompts whose zero-variance groups are dropped), now or in flight
while the previous step trains (async mode)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .algo.batching import trainable_groups
from .algo.dynamic_sampling import DynamicSampler
from .data.rewards.base import scalar_reward
from .data.sample import Sample

if TYPE_CHECKING:
    from .data.rewards.base import RewardFunction
    from .driver import Prepared
    from .rollout.base import Rollout


@dataclass
class StepRollout:
    """One step's samples (already scored under dynamic sampling) and the rollout's own metrics."""

    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)


def next_samples(prepared: Prepared) -> list[Sample]:
    n = prepared.spec.rollout.n_samples_per_prompt
    samples: list[Sample] = []
    for prompt in prepared.source.next_batch(prepared.spec.rollout.batch_size):
        samples.extend(prompt.to_samples(n, first_index=len(samples)))
    return samples


def step_rollout(prepared: Prepared, rollout: Rollout) -> StepRollout:
    """One step's samples, generated now: rollout.batchSize groups, or dynamic sampling's."""
    if prepared.spec.algorithm.dynamic_sampling.enabled:
        return dynamic_rollout(prepared, rollout)
    return StepRollout(rollout.generate(next_samples(prepared)))


def next_rollout_async(prepared: Prepared, rollout: Rollout) -> Future[StepRollout]:
    """The next step's rollout, in flight while this step trains."""
    if prepared.spec.algorithm.dynamic_sampling.enabled:
        # Rounds, scoring and the abort are driven from a thread of their own.
        return _in_background(dynamic_rollout, prepared, rollout)
    return _then(rollout.generate_async(next_samples(prepared)), StepRollout)


def _in_background(fn: Callable[..., StepRollout], *args: Any) -> Future[StepRollout]:
    """Run ``fn`` in a daemon thread (one stuck on a stopped rollout manager cannot hold up exit)."""
    future: Future[StepRollout] = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=work, name="rljob-next-rollout", daemon=True).start()
    return future


def _then(future: Future[list[Sample]], fn: Callable[[list[Sample]], StepRollout]) -> Future[StepRollout]:
    out: Future[StepRollout] = Future()

    def done(f: Future[list[Sample]]) -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as exc:
            out.set_exception(exc)

    future.add_done_callback(done)
    return out


@dataclass
class _SamplingCounters:
    """One step's dynamic-sampling counters beyond the sampler's own."""

    submitted: int = 0  # groups submitted so far: a group's number is its submission order
    abandoned: int = 0  # groups that came back after the target was reached (aborted or not): dropped
    reward_s: float = 0.0


def dynamic_rollout(prepared: Prepared, rollout: Rollout) -> StepRollout:
    """DAPO dynamic sampling: rounds of over-sampled prompts, one request batch per group; each group
    is scored as it completes and kept if its rewards differ; once rollout.batchSize groups are kept
    the requests still in flight are aborted. Out of rounds, the step trains on the kept groups,
    cut to whole global batches (``trainable_groups``). Every prompt a round takes from the data
    source is consumed, kept or not, so the checkpointed data position stays exact."""
    spec = prepared.spec
    n, gbs = spec.rollout.n_samples_per_prompt, spec.training.global_batch_size
    sampler: DynamicSampler[tuple[int, list[Sample]]] = DynamicSampler.from_spec(
        spec.algorithm.dynamic_sampling, spec.rollout.batch_size
    )
    counters = _SamplingCounters()
    t0 = time.perf_counter()
    while count := sampler.start_round():
        futures: dict[Future[list[Sample]], int] = {}
        for prompt in prepared.source.next_batch(count):
            group = prompt.to_samples(n, first_index=counters.submitted * n)  # unique while scored
            futures[rollout.generate_async(group)] = counters.submitted
            counters.submitted += 1
        _collect_round(prepared, rollout, sampler, futures, counters)
    kept = [group for _, group in sorted(sampler.kept_groups, key=lambda item: item[0])]
    trained = trainable_groups(len(kept), n, gbs)
    metrics = sampler.metrics()
    metrics.update(
        {
            "dynamic_sampling/groups_abandoned": float(counters.abandoned),
            "dynamic_sampling/groups_trained": float(trained),
            "time/reward": counters.reward_s,
            "time/dynamic_sampling": time.perf_counter() - t0,
        }
    )
    return StepRollout(flatten_groups(kept[:trained]), metrics)


def _collect_round(
    prepared: Prepared,
    rollout: Rollout,
    sampler: DynamicSampler[tuple[int, list[Sample]]],
    futures: dict[Future[list[Sample]], int],
    counters: _SamplingCounters,
) -> None:
    """Wait for a round's groups, scoring and offering each batch of completed ones to the sampler;
    abort the rest once enough are kept (they still come back, and are dropped)."""
    key = prepared.spec.reward.reward_key
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        groups = sorted(((futures[f], f.result()) for f in done), key=lambda item: item[0])
        if sampler.enough:
            counters.abandoned += len(groups)
            continue
        t0 = time.perf_counter()
        asyncio.run(_score_groups(prepared.reward, [group for _, group in groups]))
        counters.reward_s += time.perf_counter() - t0
        for order, group in groups:
            sampler.add_group((order, group), [scalar_reward(s, key) for s in group])
        if sampler.enough and pending:
            rollout.abort()


async def _score_groups(reward: RewardFunction, groups: list[list[Sample]]) -> None:
    await asyncio.gather(*(reward.score(group) for group in groups))


def flatten_groups(groups: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Groups -> one rollout batch: samples of a group consecutive (as GRPO needs), ``index`` renumbered
    to the position in the batch."""
    samples = [sample for group in groups for sample in group]
    for position, sample in enumerate(samples):
        sample.index = position
    return samples
