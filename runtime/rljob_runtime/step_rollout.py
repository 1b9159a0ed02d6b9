"""One step's rollout: plain (rollout.batchSize prompts x nSamplesPerPrompt) or DAPO dynamic
sampling (rounds of over-sampled prompts whose groups the filter drops: zero reward variance, or
rollout.customFilter), with partial rollout's carried groups continued first; made now, or ahead of
the trainer on a thread of its own (async mode: ``rollouts_ahead``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .algo.batching import trainable_groups
from .algo.dynamic_sampling import DynamicSampler
from .carried import unfinished
from .data.sample import Sample

if TYPE_CHECKING:
    from .algo.group_filter import Verdict
    from .prepare import Prepared
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


@dataclass
class _SamplingCounters:
    """One step's dynamic-sampling counters beyond the sampler's own."""

    submitted: int = 0  # groups submitted so far: a group's number is its submission order
    abandoned: int = 0  # groups that came back after the target was reached (aborted or not): dropped
    continued_groups: int = 0  # carried groups from the last step (partial rollout) submitted again
    continued_samples: int = 0  # their samples that still needed generation
    reward_s: float = 0.0
    carry: list[list[Sample]] = field(default_factory=list)  # partial rollout: for the next step


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
    partial = spec.rollout.partial_rollout
    t0 = time.perf_counter()
    while count := sampler.start_round():
        futures: dict[Future[list[Sample]], int] = {}
        # Partial rollout: the groups aborted when the last step had its batch go first, continued.
        for group in prepared.carried.take(count) if partial else []:
            for offset, sample in enumerate(group):
                sample.index = counters.submitted * n + offset
            counters.continued_groups += 1
            counters.continued_samples += len(unfinished(group))
            futures[_continue_group(rollout, group)] = counters.submitted
            counters.submitted += 1
        for prompt in prepared.source.next_batch(count - len(futures)):
            group = prompt.to_samples(n, first_index=counters.submitted * n)  # unique while scored
            futures[rollout.generate_async(group)] = counters.submitted
            counters.submitted += 1
        _collect_round(prepared, rollout, sampler, futures, counters)
    if partial:
        prepared.carried.put(counters.carry)
    kept = [group for _, group in sorted(sampler.kept_groups, key=lambda item: item[0])]
    trained = trainable_groups(len(kept), n, gbs)
    metrics = sampler.metrics()
    metrics.update(
        {
            "dynamic_sampling/groups_abandoned": float(counters.abandoned),
            "dynamic_sampling/groups_trained": float(trained),
            **(
                {
                    "partial/groups_carried": float(len(counters.carry)),
                    "partial/groups_continued": float(counters.continued_groups),
                    "partial/samples_continued": float(counters.continued_samples),
                    "partial/tokens_carried": float(
                        sum(len(s.response_ids) for g in counters.carry for s in g)
                    ),
                }
                if partial
                else {}
            ),
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
    """Wait for a round's groups, scoring, filtering and offering each batch of completed ones to the
    sampler; abort the rest once enough are kept. They still come back: dropped, or with partial
    rollout carried to the next step with what they generated."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        groups = sorted(((futures[f], f.result()) for f in done), key=lambda item: item[0])
        if sampler.enough:
            _surplus(prepared, counters, [group for _, group in groups])
            continue
        t0 = time.perf_counter()
        verdicts = asyncio.run(_score_and_filter(prepared, [group for _, group in groups]))
        counters.reward_s += time.perf_counter() - t0
        for at, ((order, group), verdict) in enumerate(zip(groups, verdicts, strict=True)):
            if sampler.enough:  # the target was reached within this batch: the rest is surplus
                _surplus(prepared, counters, [g for _, g in groups[at:]])
                break
            sampler.offer((order, group), keep=verdict.keep, reason=verdict.reason)
        if sampler.enough and pending:
            rollout.abort()


def _surplus(prepared: Prepared, counters: _SamplingCounters, groups: list[list[Sample]]) -> None:
    """Groups back after the target was reached: dropped, or carried to the next step (partial rollout)."""
    if prepared.spec.rollout.partial_rollout:
        counters.carry.extend(groups)
    else:
        counters.abandoned += len(groups)


async def _score_and_filter(prepared: Prepared, groups: list[list[Sample]]) -> list[Verdict]:
    await asyncio.gather(*(prepared.reward.score(group) for group in groups))
    return list(await asyncio.gather(*(prepared.group_filter(group) for group in groups)))


def _continue_group(rollout: Rollout, group: list[Sample]) -> Future[list[Sample]]:
    """A carried group back in flight: only its unfinished samples are generated (continued from
    their tokens); the future answers the whole group."""
    todo = unfinished(group)
    if not todo:
        done: Future[list[Sample]] = Future()
        done.set_result(group)
        return done
    out: Future[list[Sample]] = Future()

    def finished(f: Future[list[Sample]]) -> None:
        try:
            f.result()  # samples are filled in place
            out.set_result(group)
        except BaseException as exc:
            out.set_exception(exc)

    rollout.generate_async(todo).add_done_callback(finished)
    return out


def flatten_groups(groups: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Groups -> one rollout batch: samples of a group consecutive (as GRPO needs), ``index`` renumbered
    to the position in the batch."""
    samples = [sample for group in groups for sample in group]
    for position, sample in enumerate(samples):
        sample.index = position
    return samples
