"""The training loop, plain like slime's train.py: for each rollout step, generate through the
router, score, compute advantages, train, push weights, save on interval, report.

The run starts from what ``prepare`` checked and loaded before Ray started; the checkpoint state it
saves and restores is ``run_state``'s. Async mode makes the rollouts of the next steps (up to
rollout.async.bufferSize) while the trainer trains (``rollouts_ahead``); weights are pushed between
generations only, unless partial rollout lets a push abort the requests in flight (they continue
under the new weights). Dynamic sampling (DAPO) replaces the plain generation of a step with rounds
of over-sampled prompts whose groups the filter drops (``dynamic_rollout``); with partial rollout
the groups aborted when a step has its batch are carried to the next (``carried``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rljob_api.spec import RLTrainingJobSpec

from . import preemption
from .algo.staleness import mask_off_policy_tokens, staleness_metrics
from .checkpoint import store
from .colocation import Turns
from .data.rewards.base import scalar_reward
from .data.sample import Sample
from .evaluation import evaluate, rollout_metrics
from .prepare import Prepared
from .report import JobIdentity, ProgressReporter
from .rollouts_ahead import StepRollouts
from .run_error import RunError
from .run_state import Resumed, load_checkpoint, restore_driver_state, save_checkpoint, save_for_preemption
from .step_rollout import StepRollout
from .sync import WeightTransport, make_transport
from .trainer_restart import RestartsExhausted, TrainerRestarts, one_line
from .wandb_log import RunIdentity, WandbLogger

if TYPE_CHECKING:
    from .rollout.base import Rollout
    from .trainer.base import TrainerBackend

log = logging.getLogger("rljob.driver")


@dataclass
class RunOptions:
    job: JobIdentity | None = None  # set: report status.progress to this RLTrainingJob
    identity: RunIdentity | None = None  # names the W&B run (wandb_log.py)
    tensorboard_dir: str | None = None
    resume: str | None = None  # overrides spec.checkpoint.resume
    stop_after: int | None = None  # stop (as if interrupted) after this many steps: tests, debugging
    ray_address: str | None = None
    on_step: Callable[[dict[str, float]], None] | None = None  # each step's metrics: benchmarks, tests


@dataclass
class RunResult:
    steps_done: int
    history: list[dict[str, float]] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)  # prompt rows (group indices) of each step
    last_checkpoint: str | None = None
    trainer_restarts: list[str] = field(default_factory=list)  # the message of each in-run restart
    preempted: bool = False  # a SIGTERM stopped the run after a step, its checkpoint written (preemption.py)


def run(prepared: Prepared, options: RunOptions) -> RunResult:
    """Start Ray, place the actors, and train until numRollout (or stop_after) steps are done."""
    import ray

    from .placement import Placement, bundle_shapes, create_placement, local_resources
    from .rollout.manager import RolloutManager
    from .trainer import create_trainer

    spec = prepared.spec
    if preemption.current().finished:  # an earlier run in this process ended (tests run several)
        preemption.reset()
    if preemption.current().requested:  # a SIGTERM while `prepare` ran: nothing to save
        raise KeyboardInterrupt
    preemption.configure(spec.fault_tolerance.termination_grace_period_seconds)
    started_ray = False
    if not ray.is_initialized():
        if options.ray_address:
            ray.init(address=options.ray_address, log_to_driver=False)
        else:
            # A local Ray sized for the job's bundles (one CPU each) plus the driver's own actors.
            ray.init(
                num_cpus=len(bundle_shapes(spec)) + 2,
                resources=local_resources(spec),
                include_dashboard=False,
                log_to_driver=False,
            )
        started_ray = True
    preemption.install()  # after ray.init, which installs a SIGTERM handler that aborts the process
    reporter = ProgressReporter(
        spec.training.num_rollout,
        job=options.job,
        tensorboard_dir=options.tensorboard_dir,
        wandb=WandbLogger.start(options.identity or RunIdentity(), spec.to_document()),
    )
    placement: Placement | None = None
    crew: Crew | None = None
    transport: WeightTransport | None = None
    trainer: TrainerBackend | None = None
    rollout: Rollout | None = None
    try:
        placement = create_placement(spec)
        # Where Ray placed the trainer and the engines picks the transport (on one node: a file
        # there), not how many nodes the cluster had when the driver started.
        transport = make_transport(spec, single_node=placement.on_one_node(), model_path=prepared.model_path)
        where = "on one node" if placement.on_one_node() else "on several nodes"
        log.info("weight sync: %s (the trainer and the engines %s)", transport.name, where)
        # A restart of the trainer group starts it again on the same bundles.
        new_trainer = functools.partial(create_trainer, spec, prepared.model_path, placement.trainer)
        trainer = new_trainer()
        resumed = load_checkpoint(prepared, options.resume, trainer)
        turns = Turns(spec, trainer, None)
        start_metrics = turns.start()  # colocated: the trainer's state leaves the GPU for the engines
        rollout = turns.rollout = RolloutManager.create(
            spec,
            prepared.model_path,
            placement,
            # a resumed run's engines load the checkpoint's HF export: no sync needed to catch up
            weights_path=store.model_dir(resumed.directory) if resumed is not None else None,
        )
        crew = Crew(trainer, rollout, transport, new_trainer, turns)
        # A relaunched engine gets the current trainer's weights (the one a restart put in place).
        rollout.refresher = functools.partial(_refresh, crew)
        if resumed is not None:
            rollout.set_weight_version(resumed.step)
        elif spec.model.megatron_checkpoint is not None:
            # The engines started from model.path; the trainer from the Megatron checkpoint: the
            # first generation must use the trainer's weights.
            transport.push(crew.trainer, rollout, 0)
        if start_metrics:
            log.info("trainer offloaded for the engines: %s", start_metrics)
        return _loop(prepared, options, crew, reporter, resumed)
    finally:
        reporter.close()
        if transport is not None:
            transport.close()
        if rollout is not None:
            rollout.shutdown()
        if crew is not None:
            crew.trainer.shutdown()  # the current one (a restart replaces it)
        elif trainer is not None:
            trainer.shutdown()
        if placement is not None:
            placement.release()
        if started_ray:
            ray.shutdown()


@dataclass
class Crew:
    """The run's live parts. A trainer restart replaces ``trainer`` (``new_trainer`` starts one on
    the run's placement); the engines, the router and the transport stay."""

    trainer: TrainerBackend
    rollout: Rollout
    transport: WeightTransport
    new_trainer: Callable[[], TrainerBackend]
    turns: Turns


def _refresh(crew: Crew, url: str) -> None:
    """``RolloutManager.refresher``: the relaunched engine at ``url`` gets the current trainer's weights."""
    crew.transport.refresh(crew.trainer, crew.rollout, url)


def _loop(
    prepared: Prepared,
    options: RunOptions,
    crew: Crew,
    reporter: ProgressReporter,
    resumed: Resumed | None,
) -> RunResult:
    spec = prepared.spec
    rng = random.Random(spec.training.seed)
    # Where a restart before the first checkpoint goes back to: step 0's data position and RNG.
    origin = (prepared.source.state_dict(), rng.getstate())
    start, buffered = restore_driver_state(prepared, rng, resumed)
    last_ckpt = str(resumed.directory) if resumed is not None else None
    result = RunResult(steps_done=start, last_checkpoint=last_ckpt)
    total = spec.training.num_rollout
    if start > 0 and last_ckpt is not None:
        reporter.resumed(start, last_ckpt)
    restarts = TrainerRestarts(spec.fault_tolerance.max_trainer_restarts)
    if start == 0 and spec.data.eval.before_training:  # before any rollout runs ahead: nothing to quiet
        reporter.baseline(evaluate(prepared, crew.rollout))
    source = StepRollouts(prepared, crew.rollout, start, buffered)  # the rollouts saved by the checkpoint
    step = start
    try:
        while step < total:
            if options.stop_after is not None and step - start >= options.stop_after:
                break
            if preemption.current().requested:
                saved = save_for_preemption(
                    prepared, crew.trainer, crew.turns, rng, source, step, result.last_checkpoint
                )
                result.last_checkpoint = saved or result.last_checkpoint
                result.preempted = True
                break
            try:
                _step(prepared, options, crew, reporter, result, rng, step, source)
            except Exception as exc:
                lost = _lost_trainer_ranks(crew.trainer, exc)
                if not lost:
                    raise
                source.close(wait=True)  # a restart must not find a generation still running
                step, buffered = _restart_trainer(
                    prepared, crew, reporter, result, rng, origin, restarts, (step, lost, exc)
                )
                source = StepRollouts(prepared, crew.rollout, step, buffered)
                continue
            step += 1
    except BaseException:
        source.close(wait=False)  # an interrupted run does not wait for a generation
        raise
    source.close(wait=True)
    # A SIGTERM during the last step: that step saved the final checkpoint; the teardown must not be
    # interrupted into "preempted" by the watchdog.
    preemption.current().finished = True
    return result


def _step(
    prepared: Prepared,
    options: RunOptions,
    crew: Crew,
    reporter: ProgressReporter,
    result: RunResult,
    rng: random.Random,
    step: int,
    source: StepRollouts,
) -> None:
    """One rollout step: take its rollout (made now, or ahead in async mode), score, train, save on
    interval, push the weights, evaluate, report."""
    spec = prepared.spec
    trainer, rollout, turns, transport = crew.trainer, crew.rollout, crew.turns, crew.transport
    total = spec.training.num_rollout
    async_mode = spec.rollout.async_.enabled
    t_step = time.perf_counter()
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    batch = source.take()
    metrics["time/generate"] = time.perf_counter() - t0
    samples = batch.samples
    metrics.update(batch.metrics)
    if any(s.reward is None for s in samples):  # dynamic sampling scored them as they came
        t0 = time.perf_counter()
        asyncio.run(prepared.reward.score(samples))
        metrics["time/reward"] = time.perf_counter() - t0
    if samples:
        metrics.update(rollout_metrics(samples, metrics["time/generate"], spec.reward.reward_key))
        # The trainer's weights have taken `step` updates: a token made by version v is step - v behind.
        metrics.update(staleness_metrics(samples, step))
        if spec.rollout.mask_off_policy_partial_tokens:
            metrics["partial/tokens_masked"] = float(mask_off_policy_tokens(samples))
    metrics.update(turns.to_trainer())
    t0 = time.perf_counter()
    train_metrics = _train(spec, trainer, samples) if samples else {"skipped_rollout": 1.0}
    metrics["time/train"] = time.perf_counter() - t0
    metrics.update({f"train/{k}": float(v) for k, v in train_metrics.items()})
    checkpoint = None
    done = step + 1
    interval = spec.checkpoint.save_interval
    if done == total or (interval and done % interval == 0):
        t0 = time.perf_counter()
        # Async mode: the next steps' rollouts are made or being made; their prompts have left the data
        # source, so they are saved with the checkpoint (none is lost), the one in progress finished first.
        with source.quiet() as buffers:
            path = save_checkpoint(prepared, trainer, done, rng, buffers)
        metrics["time/save"] = time.perf_counter() - t0
        metrics.update(turns.after_save())
        if path is not None:
            checkpoint = (done, str(path))
            result.last_checkpoint = str(path)
    push = not async_mode or done % spec.rollout.async_.update_weights_interval == 0
    sync = functools.partial(transport.push, trainer, rollout, done) if push else dict
    if push and async_mode and not spec.rollout.partial_rollout:
        t0 = time.perf_counter()
        with source.quiet():  # never update weights in the middle of a generation
            metrics["time/wait_generation"] = time.perf_counter() - t0
            metrics.update(turns.to_engines(sync))
    else:  # sync mode: nothing in flight; partial rollout: the requests in flight are continued
        metrics.update(turns.to_engines(sync))
    eval_rewards = None
    preempted = preemption.current().requested  # the grace period is for the checkpoint, not an eval
    if spec.data.eval.interval and (done % spec.data.eval.interval == 0 or done == total) and not preempted:
        with source.quiet():  # a dynamic-sampling round in flight would abort the eval requests
            eval_rewards = evaluate(prepared, rollout)
        metrics.update({f"eval/{k}/reward": v for k, v in eval_rewards.items()})
    metrics["time/step"] = time.perf_counter() - t_step
    reporter.step(done, metrics, checkpoint=checkpoint, eval_rewards=eval_rewards)
    result.history.append({"step": float(done), **metrics})
    if options.on_step is not None:
        options.on_step(result.history[-1])
    result.batches.append(sorted({s.group_index for s in samples if s.group_index is not None}))
    result.steps_done = done


def _lost_trainer_ranks(trainer: TrainerBackend, exc: Exception) -> list[int]:
    """The trainer ranks that are gone, when ``exc`` came with (or from) their loss; else none."""
    if isinstance(exc, RunError) or not hasattr(trainer, "lost_ranks"):
        return []
    try:
        return trainer.lost_ranks()
    except Exception:  # Ray itself failing: not a trainer loss to recover from
        log.exception("could not check the trainer ranks after: %s", exc)
        return []


def _restart_trainer(
    prepared: Prepared,
    crew: Crew,
    reporter: ProgressReporter,
    result: RunResult,
    rng: random.Random,
    origin: tuple[dict[str, Any], Any],
    restarts: TrainerRestarts,
    failure: tuple[int, list[int], Exception],
) -> tuple[int, list[StepRollout]]:
    """A new trainer group on the same placement, loaded from the run's latest checkpoint (or the
    initial weights), its weights pushed to the engines; the step to go on from and the rollouts the
    checkpoint saved. Raises RunError when faultTolerance.maxTrainerRestarts is used up."""
    step, lost, exc = failure
    checkpoint = result.last_checkpoint  # this run's latest save, or the checkpoint it resumed from
    resume_step = store.read_driver_state(Path(checkpoint))["step"] if checkpoint else 0
    try:
        restart = restarts.admit(step=step, resume_step=resume_step, lost_ranks=lost, cause=one_line(exc))
    except RestartsExhausted as exhausted:
        raise RunError(str(exhausted)) from exc
    message = restarts.message(restart, checkpoint)
    log.warning("%s", message)
    crew.trainer.shutdown()
    crew.transport.trainer_replaced(crew.rollout)
    crew.turns.make_room()  # colocated: the engines free the GPU before the new trainer takes it
    crew.trainer = crew.turns.trainer = crew.new_trainer()
    if checkpoint:
        crew.trainer.load(checkpoint)
        resume_step, buffered = restore_driver_state(prepared, rng, Resumed(resume_step, Path(checkpoint)))
    else:
        data, rng_state = origin
        prepared.source.load_state_dict(data)
        rng.setstate(rng_state)
        prepared.carried.load_state_dict([])
        buffered = []
    crew.turns.to_engines(functools.partial(crew.transport.push, crew.trainer, crew.rollout, resume_step))
    # The steps after the checkpoint are done again: their first tries never reach the final model.
    result.history[:] = [h for h in result.history if h["step"] <= resume_step]
    del result.batches[max(0, len(result.batches) - (result.steps_done - resume_step)) :]
    result.steps_done = resume_step
    result.trainer_restarts.append(message)
    reporter.trainer_restarted(restart.number, message)
    return resume_step, buffered


def _train(spec: RLTrainingJobSpec, trainer: TrainerBackend, samples: list[Sample]) -> dict[str, float]:
    import torch

    from .algo.advantages import compute_advantages
    from .algo.masked import masked_explained_variance
    from .trainer.base import build_batch
    from .trainer.rank_base import skips_logprobs_pass

    mask = build_batch(samples).loss_mask.float()
    old_logp = ref_logp = values = kl = None
    if not skips_logprobs_pass(spec, len(samples)):  # when skipped, the step's forward gives old_logp
        logprobs = trainer.logprobs(samples)
        old_logp, ref_logp, values = logprobs.logp, logprobs.ref_logp, logprobs.values
        mask = mask[:, : old_logp.shape[1]]
        kl = None if ref_logp is None else (old_logp - ref_logp) * mask
    rewards = torch.tensor([scalar_reward(s, spec.reward.reward_key) for s in samples], dtype=torch.float32)
    advantages = compute_advantages(
        spec.algorithm, rewards, mask, spec.rollout.n_samples_per_prompt, kl=kl, values=values
    )
    metrics = trainer.train(
        samples, advantages.advantages, old_logp, ref_logp, values=values, returns=advantages.returns
    )
    if values is not None and advantages.returns is not None:
        # How much of the returns' variance the critic explained before this step's update.
        metrics["value_explained_var"] = masked_explained_variance(values, advantages.returns, mask)
    return metrics
