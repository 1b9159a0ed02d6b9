# long-file: preparation, the loop and checkpoint state in one module; not yet split into prepare and run state
"""The training loop, plain like slime's train.py: for each rollout step, generate through the
router, score, compute advantages, train, push weights, save on interval, report.

Everything that can be wrong with the config or the data is checked in `prepare` before Ray
starts (no GPU is taken for a run that cannot work). Async mode makes the rollouts of the next
steps (up to rollout.async.bufferSize) while the trainer trains (``rollouts_ahead``); weights are
pushed between generations only, unless partial rollout lets a push abort the requests in flight
(they continue under the new weights). Dynamic sampling (DAPO) replaces the plain generation of a
step with rounds of over-sampled prompts whose groups the filter drops (``dynamic_rollout``); with
partial rollout the groups aborted when a step has its batch are carried to the next (``carried``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rljob_api.contract import MEGATRON_CACHE_ENV
from rljob_api.spec import RLTrainingJobSpec
from rljob_api.support import unsupported

from . import preemption
from .algo.group_filter import GroupFilter, load_group_filter
from .algo.staleness import mask_off_policy_tokens, staleness_metrics
from .carried import CarriedGroups
from .checkpoint import store
from .checkpoint.errors import CheckpointWriteError
from .colocation import Turns
from .data.prompts import EvalDataset, PromptSource, load_eval_datasets
from .data.rewards.base import RewardFunction, scalar_reward
from .data.rewards.build import build_reward, reward_needs_label
from .data.sample import Sample, Status
from .models.resolve import resolve_model, resolve_tokenizer
from .report import JobIdentity, ProgressReporter
from .rollout.custom_generate import load_hook
from .rollouts_ahead import StepRollouts
from .step_rollout import StepRollout
from .sync import WeightTransport, make_transport
from .trainer_restart import RestartsExhausted, TrainerRestarts, one_line
from .wandb_log import RunIdentity, WandbLogger

if TYPE_CHECKING:
    from .rollout.base import Rollout
    from .trainer.base import TrainerBackend

log = logging.getLogger("rljob.driver")


class RunError(RuntimeError):
    """The run cannot go on; the message is the one-line reason the operator shows."""


@dataclass
class Prepared:
    """What `prepare` checked and loaded before any Ray actor exists."""

    spec: RLTrainingJobSpec
    model_path: str
    source: PromptSource
    eval_sets: list[EvalDataset]
    reward: RewardFunction
    dropped_prompts: int
    group_filter: GroupFilter = field(default_factory=GroupFilter)  # dynamic sampling's
    carried: CarriedGroups = field(default_factory=CarriedGroups)  # partial rollout's


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


def prepare(spec: RLTrainingJobSpec) -> Prepared:
    """Fail fast: unsupported options, the model, the tokenizer, the data and the reward. The returned
    spec is the one to run: it may start the megatron trainer from the model cache
    (``use_megatron_cache``)."""
    check_spec(spec)
    model_path = str(resolve_model(spec.model.path))
    if spec.algorithm.advantage_estimator == "ppo" and spec.algorithm.critic.path:
        resolve_model(
            spec.algorithm.critic.path, field="algorithm.critic.path"
        )  # downloaded here, or refused
    if spec.training.backend == "megatron":
        check_megatron_layout(spec, model_path)
        check_megatron_installed()
        spec = use_megatron_cache(spec, model_path)
        if spec.model.megatron_checkpoint is not None:
            check_megatron_checkpoint(str(spec.model.megatron_checkpoint))
    if spec.rollout.engine == "sglang":
        check_sglang()
    from transformers import AutoTokenizer

    tokenizer_path = str(resolve_tokenizer(spec.model.tokenizer)) if spec.model.tokenizer else model_path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=spec.model.trust_remote_code)
    needs_label = reward_needs_label(spec.reward)
    source, loaded = PromptSource.from_spec(
        spec.data,
        seed=spec.training.seed,
        tokenizer=tokenizer,
        chat_template=spec.model.chat_template,
        require_label=needs_label,
    )
    eval_sets = load_eval_datasets(
        spec.data, tokenizer=tokenizer, chat_template=spec.model.chat_template, require_label=needs_label
    )
    reward = build_reward(spec.reward)
    if spec.rollout.custom_generate:  # import and check the hook now, not after the engines started
        load_hook(spec.rollout.custom_generate)
    group_filter = load_group_filter(spec.rollout.custom_filter, reward_key=spec.reward.reward_key)
    return Prepared(spec, model_path, source, eval_sets, reward, loaded.dropped_too_long, group_filter)


def check_spec(spec: RLTrainingJobSpec) -> None:
    """What `prepare` checks from the spec alone. The models ran these rules when the spec was parsed
    (as the API server did at admission); a spec built or changed in code meets them here: what this
    runtime does not run (the support matrix, in the API server's words), then the other spec-wide
    rules (batch sizes that fill whole steps, dynamic sampling's groups)."""
    refused = unsupported(spec)
    if refused:
        raise RunError(" | ".join(refused))
    broken = [
        f"spec{rule.field}: {rule.message}"
        for rule in type(spec).rules
        if not rule.transition and not rule.check(spec)
    ]
    if broken:
        raise RunError(" | ".join(broken))


def check_megatron_installed() -> None:
    """Checked after the layout, so a manifest's mistakes are named on any machine."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise RunError(
            "not supported by this runtime yet: training.backend megatron without megatron-core "
            "installed (pip install 'rljob[megatron]')"
        )


def check_megatron_checkpoint(path: str) -> None:
    """model.megatronCheckpoint must be a torch_dist checkpoint (its tensors are checked against the
    model when the ranks load it)."""
    from .trainer.megatron.checkpoint import find_dist_checkpoint

    try:
        find_dist_checkpoint(path)
    except FileNotFoundError as err:
        raise RunError(f"model.megatronCheckpoint: {err}") from err


def use_megatron_cache(spec: RLTrainingJobSpec, model_path: str) -> RLTrainingJobSpec:
    """``spec`` starting from the conversion of model.path that the operator's conversion job wrote
    into the model cache, when the operator says it ran one (MEGATRON_CACHE_ENV) and the spec names
    no model.megatronCheckpoint of its own; else ``spec`` unchanged."""
    from .models.megatron_cache import converted_dir, is_converted

    if os.environ.get(MEGATRON_CACHE_ENV) != "1" or spec.model.megatron_checkpoint is not None:
        return spec
    converted = converted_dir(Path(model_path))
    if not is_converted(converted):
        raise RunError(
            f"the converted Megatron checkpoint of {model_path} that the conversion job made is missing at "
            f"{converted} (removed from the model cache since?): create the job again, and its conversion "
            "job converts the model again; or unset resources.modelCache"
        )
    print(f"model.path {spec.model.path}: starting from its Megatron conversion {converted}", flush=True)
    # model_copy without validation: only the field the operator's conversion stands for changes (a
    # str, as the spec's paths are).
    model = spec.model.model_copy(update={"megatron_checkpoint": str(converted)})
    return spec.model_copy(update={"model": model})


def check_sglang() -> None:
    """The pinned SGLang release must be the runtime's (its HTTP API and weight formats are the ones
    the runtime speaks): refused here, before Ray starts, with the version needed."""
    from .sglang_install import SGLangInstallError, check_sglang_installed

    try:
        check_sglang_installed()
    except SGLangInstallError as err:
        raise RunError(str(err)) from err


def check_megatron_layout(spec: RLTrainingJobSpec, model_path: str) -> None:
    """The model's architecture and training.parallelism against the trainer GPUs, from config.json
    alone: refused here with the numbers, not after Ray placed the ranks."""
    from .trainer.megatron.checks import check_layout, read_hf_config

    try:
        check_layout(spec, read_hf_config(model_path))
    except (ValueError, FileNotFoundError) as err:
        raise RunError(f"training.backend megatron: {err}") from err


def run(prepared: Prepared, options: RunOptions) -> RunResult:
    """Start Ray, place the actors, and train until numRollout (or stop_after) steps are done."""
    import ray

    from .placement import bundle_shapes, create_placement, local_resources
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
    transport = make_transport(
        spec,
        single_node=len([n for n in ray.nodes() if n.get("Alive")]) == 1,
        model_path=prepared.model_path,
    )
    reporter = ProgressReporter(
        spec.training.num_rollout,
        job=options.job,
        tensorboard_dir=options.tensorboard_dir,
        wandb=WandbLogger.start(options.identity or RunIdentity(), spec.to_document()),
    )
    crew: Crew | None = None
    trainer: TrainerBackend | None = None
    rollout: Rollout | None = None
    try:
        placement = create_placement(spec)
        # A restart of the trainer group starts it again on the same bundles.
        new_trainer = functools.partial(create_trainer, spec, prepared.model_path, placement.trainer)
        trainer = new_trainer()
        resumed = _load_checkpoint(prepared, options, trainer)
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
        transport.close()
        if rollout is not None:
            rollout.shutdown()
        if crew is not None:
            crew.trainer.shutdown()  # the current one (a restart replaces it)
        elif trainer is not None:
            trainer.shutdown()
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
    start, buffered = _restore_driver_state(prepared, rng, resumed)
    last_ckpt = str(resumed.directory) if resumed is not None else None
    result = RunResult(steps_done=start, last_checkpoint=last_ckpt)
    total = spec.training.num_rollout
    if start > 0:
        print(f"resumed from step {start} ({last_ckpt})", flush=True)
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
                _save_for_preemption(prepared, crew, result, rng, source, step)
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
            path = _checkpoint(prepared, trainer, done, rng, buffers)
        metrics["time/save"] = time.perf_counter() - t0
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


def _save_for_preemption(
    prepared: Prepared,
    crew: Crew,
    result: RunResult,
    rng: random.Random,
    source: StepRollouts,
    step: int,
) -> None:
    """After a SIGTERM: a checkpoint of the last finished step (unless that step saved one), so the
    resumed job goes on from the next. Async mode's generation in flight finishes first: its prompts
    have left the data source and are saved with the checkpoint."""
    state = preemption.current()
    saved = result.last_checkpoint is not None and (
        store.read_driver_state(Path(result.last_checkpoint))["step"] == step
    )
    if step > 0 and not saved:
        t0 = time.perf_counter()
        print(f"preempted: saving a checkpoint of step {step}", flush=True)
        crew.turns.to_trainer()  # colocated: the trainer's state back on its GPU to be saved
        with source.quiet() as buffers:
            path = _save(prepared, crew.trainer, Path(prepared.spec.checkpoint.path), step, rng, buffers)
        result.last_checkpoint = str(path)
        print(
            f"preempted: checkpoint of step {step} saved in {time.perf_counter() - t0:.1f} s: {path}",
            flush=True,
        )
    state.finished = True
    result.preempted = True


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
        resume_step, buffered = _restore_driver_state(prepared, rng, Resumed(resume_step, Path(checkpoint)))
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

    logprobs = trainer.logprobs(samples)
    mask = build_batch(samples).loss_mask.float()
    mask = mask[:, : logprobs.logp.shape[1]]
    rewards = torch.tensor([scalar_reward(s, spec.reward.reward_key) for s in samples], dtype=torch.float32)
    kl = None if logprobs.ref_logp is None else (logprobs.logp - logprobs.ref_logp) * mask
    advantages = compute_advantages(
        spec.algorithm, rewards, mask, spec.rollout.n_samples_per_prompt, kl=kl, values=logprobs.values
    )
    metrics = trainer.train(
        samples,
        advantages.advantages,
        logprobs.logp,
        logprobs.ref_logp,
        values=logprobs.values,
        returns=advantages.returns,
    )
    if logprobs.values is not None and advantages.returns is not None:
        # How much of the returns' variance the critic explained before this step's update.
        metrics["value_explained_var"] = masked_explained_variance(logprobs.values, advantages.returns, mask)
    return metrics


def rollout_metrics(
    samples: Sequence[Sample], generate_seconds: float, reward_key: str | None = None
) -> dict[str, float]:
    rewards = [scalar_reward(s, reward_key) for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    n = max(len(samples), 1)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / n
    return {
        "reward/mean": mean,
        "reward/std": var**0.5,
        "response_length/mean": sum(lengths) / n,
        "response/truncated_frac": sum(s.status == Status.TRUNCATED for s in samples) / n,
        "rollout/tokens_per_s": sum(lengths) / max(generate_seconds, 1e-9),
    }


def evaluate(prepared: Prepared, rollout: Rollout) -> dict[str, float]:
    """Mean reward per evaluation dataset, sampled with data.eval's settings."""
    spec = prepared.spec
    out = {}
    for dataset in prepared.eval_sets:
        samples = dataset.samples()
        rollout.generate(
            samples,
            temperature=spec.data.eval.temperature,
            top_p=spec.data.eval.top_p,
            max_new_tokens=dataset.max_response_len or spec.rollout.max_response_len,
        )
        asyncio.run(prepared.reward.score(samples))
        out[dataset.name] = sum(scalar_reward(s, spec.reward.reward_key) for s in samples) / max(
            len(samples), 1
        )
    return out


def _checkpoint(
    prepared: Prepared, trainer: TrainerBackend, step: int, rng: random.Random, buffers: list[StepRollout]
) -> Path | None:
    """Save step ``step``. A failed write (disk full, quota, I/O error) leaves the previous checkpoint
    as the latest and training goes on, except for the last step's save, which the run needs."""
    try:
        return _save(prepared, trainer, Path(prepared.spec.checkpoint.path), step, rng, buffers)
    except CheckpointWriteError as err:
        if step == prepared.spec.training.num_rollout:
            raise
        print(f"checkpoint of step {step} failed, training goes on: {err}", flush=True)
        log.warning("checkpoint of step %d failed: %s", step, err)
        return None


def _save(
    prepared: Prepared,
    trainer: TrainerBackend,
    root: Path,
    step: int,
    rng: random.Random,
    buffers: list[StepRollout],
) -> Path:
    """Written into a staging directory that becomes iter_<step> only once complete (store.save)."""

    def write(directory: Path) -> None:
        trainer.save(str(directory))
        store.write_driver_state(
            directory,
            {
                "step": step,
                "data": prepared.source.state_dict(),
                "rng": list(rng.getstate()[1]),
                "rng_version": rng.getstate()[0],
                # async mode's rollouts made ahead of the trainer, oldest first
                "rollout_buffers": [
                    {"samples": [s.to_dict() for s in b.samples], "metrics": b.metrics} for b in buffers
                ],
                "partial_groups": prepared.carried.state_dict(),  # partial rollout's carried groups
            },
        )

    return store.save(root, step, write, keep=prepared.spec.checkpoint.max_to_keep)


@dataclass(frozen=True)
class Resumed:
    step: int
    directory: Path


def _load_checkpoint(prepared: Prepared, options: RunOptions, trainer: TrainerBackend) -> Resumed | None:
    """The latest complete checkpoint into the trainer (before the engines start: they load its HF
    export, and a colocated trainer still holds the GPU), per checkpoint.resume."""
    policy = options.resume or prepared.spec.checkpoint.resume
    root = prepared.spec.checkpoint.path
    for leftover in store.clean(root):  # a save interrupted by a crash: never loaded
        print(f"removed an incomplete checkpoint: {leftover}", flush=True)
    found = store.latest(root) if policy != "never" else None
    if found is None:
        if policy == "required":
            raise RunError(
                f"checkpoint.resume is required but there is no complete checkpoint under {prepared.spec.checkpoint.path}"
            )
        return None
    step, directory = found
    trainer.load(str(directory))
    return Resumed(step, Path(directory))


def _restore_driver_state(
    prepared: Prepared, rng: random.Random, resumed: Resumed | None
) -> tuple[int, list[StepRollout]]:
    """The data-source position, the RNG, the rollouts made ahead and the carried groups saved with
    the checkpoint."""
    if resumed is None:
        return 0, []
    state = store.read_driver_state(resumed.directory)
    prepared.source.load_state_dict(state["data"])
    rng.setstate((state["rng_version"], tuple(state["rng"]), None))
    prepared.carried.load_state_dict(state.get("partial_groups", []))
    return resumed.step, _saved_rollouts(state)


def _saved_rollouts(state: dict[str, Any]) -> list[StepRollout]:
    if "rollout_buffers" in state:
        return [
            StepRollout([Sample.from_dict(d) for d in b["samples"]], dict(b.get("metrics", {})))
            for b in state["rollout_buffers"]
        ]
    # Checkpoints before bufferSize > 1: at most one rollout in flight (possibly empty: dynamic
    # sampling that kept no whole global batch).
    samples = [Sample.from_dict(d) for d in state.get("rollout_buffer", [])]
    if not state.get("rollout_buffered", bool(samples)):
        return []
    return [StepRollout(samples, dict(state.get("rollout_buffer_metrics", {})))]
