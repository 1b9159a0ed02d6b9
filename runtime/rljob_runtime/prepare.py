"""Everything that can be wrong with the config or the data, checked before Ray starts (no GPU is
taken for a run that cannot work): the support matrix and the spec-wide rules, the model (downloaded
here), the megatron layout and installation, the SGLang release, the tokenizer, the data, the
reward and the hooks. ``prepare`` returns what the run needs of them: the ``Prepared`` run.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

from rljob_api.contract import MEGATRON_CACHE_ENV
from rljob_api.spec import RLTrainingJobSpec
from rljob_api.support import unsupported

from .algo.group_filter import GroupFilter, load_group_filter
from .carried import CarriedGroups
from .data.prompts import EvalDataset, PromptSource, load_eval_datasets
from .data.rewards.base import RewardFunction
from .data.rewards.build import build_reward, reward_needs_label
from .models.resolve import resolve_model, resolve_tokenizer
from .rollout.custom_generate import load_hook
from .run_error import RunError


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
