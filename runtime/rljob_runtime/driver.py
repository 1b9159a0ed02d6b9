"""The training loop, plain like slime's train.py: for each rollout step, generate through the
router, score, compute advantages, train, push weights, save on interval, report.

Everything that can be wrong with the config or the data is checked in `prepare` before Ray
starts (no GPU is taken for a run that cannot work). Async mode overlaps the generation of step
k+1 with training on step k (one step off-policy); weights are pushed between generations only.
Dynamic sampling (DAPO) replaces the plain generation of a step with rounds of over-sampled
prompts whose zero-variance groups are dropped (``dynamic_rollout``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rljob_api.spec import RLTrainingJobSpec
from rljob_api.support import unsupported

from .checkpoint import store
from .colocation import Turns
from .data.prompts import EvalDataset, PromptSource, load_eval_datasets
from .data.rewards.base import scalar_reward
from .data.rewards.build import build_reward, reward_needs_label
from .data.sample import Sample, Status
from .models import resolve_model, resolve_tokenizer
from .report import JobIdentity, ProgressReporter
from .rollout.custom_generate import load_hook
from .step_rollout import StepRollout, next_rollout_async, step_rollout
from .sync import WeightTransport, make_transport
from .wandb_log import RunIdentity, WandbLogger

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
    reward: Any
    dropped_prompts: int


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


def prepare(spec: RLTrainingJobSpec) -> Prepared:
    """Fail fast: unsupported options, the model, the tokenizer, the data and the reward."""
    check_spec(spec)
    model_path = str(resolve_model(spec.model.path))
    if spec.algorithm.advantage_estimator == "ppo" and spec.algorithm.critic.path:
        resolve_model(
            spec.algorithm.critic.path, field="algorithm.critic.path"
        )  # downloaded here, or refused
    if spec.training.backend == "megatron":
        check_megatron_layout(spec, model_path)
        check_megatron_installed()
    if spec.rollout.engine == "sglang":
        check_sglang()
    from transformers import AutoTokenizer

    tokenizer_path = str(resolve_tokenizer(spec.model.tokenizer)) if spec.model.tokenizer else model_path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
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
    return Prepared(spec, model_path, source, eval_sets, reward, loaded.dropped_too_long)


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
    unwind_on_sigterm()  # after ray.init, which installs a SIGTERM handler that aborts the process
    trainer = rollout = None
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
    try:
        placement = create_placement(spec)
        trainer = create_trainer(spec, prepared.model_path, placement.trainer)
        resumed = _load_checkpoint(prepared, options, trainer)
        turns = Turns(spec, trainer, None)
        start_metrics = turns.start()  # colocated: the trainer's state leaves the GPU for the engines
        rollout = RolloutManager.create(
            spec,
            prepared.model_path,
            placement,
            # a resumed run's engines load the checkpoint's HF export: no sync needed to catch up
            weights_path=store.model_dir(resumed.directory) if resumed is not None else None,
        )
        rollout.refresher = lambda url: transport.refresh(trainer, rollout, url)
        turns.rollout = rollout
        if resumed is not None:
            rollout.set_weight_version(resumed.step)
        if start_metrics:
            log.info("trainer offloaded for the engines: %s", start_metrics)
        return _loop(prepared, options, trainer, rollout, reporter, transport, turns, resumed)
    finally:
        reporter.close()
        transport.close()
        if rollout is not None:
            rollout.shutdown()
        if trainer is not None:
            trainer.shutdown()
        if started_ray:
            ray.shutdown()


def unwind_on_sigterm() -> None:
    """SIGTERM (KubeRay stopping the job, a pod going away) unwinds like Ctrl-C, so the finally
    blocks stop the engines, the router, the trainer actors and a Ray we started."""
    import signal

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupted)


def _loop(
    prepared: Prepared,
    options: RunOptions,
    trainer: Any,
    rollout: Any,
    reporter: ProgressReporter,
    transport: WeightTransport,
    turns: Turns,
    resumed: Resumed | None,
) -> RunResult:
    spec = prepared.spec
    ckpt_root = Path(spec.checkpoint.path)
    rng = random.Random(spec.training.seed)
    start, buffered = _restore_driver_state(prepared, rng, resumed)
    last_ckpt = str(resumed.directory) if resumed is not None else None
    result = RunResult(steps_done=start, last_checkpoint=last_ckpt)
    total = spec.training.num_rollout
    if start > 0:
        print(f"resumed from step {start} ({last_ckpt})", flush=True)
    async_mode = spec.rollout.async_.enabled
    pending: Future[StepRollout] | None = None
    if buffered is not None:
        pending = Future()
        pending.set_result(buffered)  # the in-flight rollout saved by the last checkpoint
    for step in range(start, total):
        if options.stop_after is not None and step - start >= options.stop_after:
            break
        t_step = time.perf_counter()
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        batch = pending.result() if pending is not None else step_rollout(prepared, rollout)
        pending = None  # consumed: a checkpoint of the last step must not save it as in flight
        metrics["time/generate"] = time.perf_counter() - t0
        if async_mode and step + 1 < total:
            pending = next_rollout_async(prepared, rollout)  # step k+1 overlaps training on step k
        samples = batch.samples
        metrics.update(batch.metrics)
        if any(s.reward is None for s in samples):  # dynamic sampling scored them as they came
            t0 = time.perf_counter()
            asyncio.run(prepared.reward.score(samples))
            metrics["time/reward"] = time.perf_counter() - t0
        if samples:
            metrics.update(rollout_metrics(samples, metrics["time/generate"], spec.reward.reward_key))
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
            # Async mode: the next step's rollout is already in flight; its prompts have left the
            # data source, so the generated samples are saved with the checkpoint (none is lost).
            buffer = pending.result() if pending is not None else None
            path = _save(prepared, trainer, ckpt_root, done, rng, buffer)
            metrics["time/save"] = time.perf_counter() - t0
            checkpoint = (done, str(path))
            result.last_checkpoint = str(path)
        push = not async_mode or done % spec.rollout.async_.update_weights_interval == 0
        if push and pending is not None:
            pending.result()  # never update weights in the middle of a generation
        sync = functools.partial(transport.push, trainer, rollout, done) if push else dict
        metrics.update(turns.to_engines(sync))
        eval_rewards = None
        if spec.data.eval.interval and (done % spec.data.eval.interval == 0 or done == total):
            if pending is not None:
                pending.result()  # a dynamic-sampling round in flight would abort the eval requests
            eval_rewards = evaluate(prepared, rollout)
            metrics.update({f"eval/{k}/reward": v for k, v in eval_rewards.items()})
        metrics["time/step"] = time.perf_counter() - t_step
        reporter.step(done, metrics, checkpoint=checkpoint, eval_rewards=eval_rewards)
        result.history.append({"step": float(done), **metrics})
        if options.on_step is not None:
            options.on_step(result.history[-1])
        result.batches.append(sorted({s.group_index for s in samples if s.group_index is not None}))
        result.steps_done = done
    return result


def _train(spec: RLTrainingJobSpec, trainer: Any, samples: list[Sample]) -> dict[str, float]:
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


def evaluate(prepared: Prepared, rollout: Any) -> dict[str, float]:
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


def _save(
    prepared: Prepared,
    trainer: Any,
    root: Path,
    step: int,
    rng: random.Random,
    buffer: StepRollout | None,
) -> Path:
    directory = store.iteration_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    trainer.save(str(directory))
    store.write_driver_state(
        directory,
        {
            "step": step,
            "data": prepared.source.state_dict(),
            "rng": list(rng.getstate()[1]),
            "rng_version": rng.getstate()[0],
            "rollout_buffer": [sample.to_dict() for sample in buffer.samples] if buffer else [],
            "rollout_buffer_metrics": buffer.metrics if buffer else {},
            "rollout_buffered": buffer is not None,
        },
    )
    store.mark_complete(directory)
    store.prune(root, prepared.spec.checkpoint.max_to_keep)
    return directory


@dataclass(frozen=True)
class Resumed:
    step: int
    directory: Path


def _load_checkpoint(prepared: Prepared, options: RunOptions, trainer: Any) -> Resumed | None:
    """The latest complete checkpoint into the trainer (before the engines start: they load its HF
    export, and a colocated trainer still holds the GPU), per checkpoint.resume."""
    policy = options.resume or prepared.spec.checkpoint.resume
    found = store.latest(prepared.spec.checkpoint.path) if policy != "never" else None
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
) -> tuple[int, StepRollout | None]:
    """The data-source position, the RNG and the in-flight rollout saved with the checkpoint."""
    if resumed is None:
        return 0, None
    state = store.read_driver_state(resumed.directory)
    prepared.source.load_state_dict(state["data"])
    rng.setstate((state["rng_version"], tuple(state["rng"]), None))
    samples = [Sample.from_dict(d) for d in state.get("rollout_buffer", [])]
    # A buffered rollout may be empty (dynamic sampling that kept no whole global batch).
    buffered = state.get("rollout_buffered", bool(samples))
    buffer = StepRollout(samples, dict(state.get("rollout_buffer_metrics", {}))) if buffered else None
    return resumed.step, buffer
