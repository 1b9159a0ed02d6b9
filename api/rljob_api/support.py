"""What this runtime runs: the support matrix, as data, and the one definition of its refusals.

Axes: device x rollout.engine x training.backend x mode (colocated / disaggregated, sync / async) x
parallelism x features. From the tables below come the `LIMITS`, each a CEL expression for the CRD
(attached to the spec root, so the API server refuses the job at admission) and the same Python
predicate, which the models run (`rljob-runtime validate`) and which `unsupported` evaluates for the
runtime's `prepare` and the megatron ranks: one message, word for word, wherever a job is refused.

What the spec alone cannot show stays at run time: the megatron layout against the model's
config.json (heads, KV heads, layers divisible by the parallel sizes) and whether SGLang /
megatron-core are installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, get_args

from .rules import Rule
from .spec_algorithm import AdvantageEstimator, AlgorithmSpec
from .spec_resources import ResourcesSpec
from .spec_rollout import RolloutSpec
from .spec_training import TrainingSpec
from .spec_workload import ModelSpec


class JobSpec(Protocol):
    """The parts of RLTrainingJobSpec the support matrix reads. A Protocol, not the spec's class:
    spec.py imports this module to attach the rules, and this one must not import it back."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def algorithm(self) -> AlgorithmSpec: ...
    @property
    def rollout(self) -> RolloutSpec: ...
    @property
    def training(self) -> TrainingSpec: ...
    @property
    def resources(self) -> ResourcesSpec: ...


NOT_YET = "not supported by this runtime yet"

# The axes' values are the API's own: a value added there must be placed in the tables below (the
# import fails with a KeyError until it is).
DEVICES: tuple[str, ...] = get_args(ResourcesSpec.model_fields["device"].annotation)
ENGINES: tuple[str, ...] = get_args(RolloutSpec.model_fields["engine"].annotation)
BACKENDS: tuple[str, ...] = get_args(TrainingSpec.model_fields["backend"].annotation)
ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)
MODES = ("colocated", "disaggregated")
MODEL_PARALLEL_DIMS = ("tensor", "pipeline", "context")

# device -> the rollout engines and trainer backends that run on it.
ENGINES_ON: dict[str, tuple[str, ...]] = {"cuda": ("sglang", "hf"), "cpu": ("hf",)}
BACKENDS_ON: dict[str, tuple[str, ...]] = {"cuda": ("megatron", "torch"), "cpu": ("torch",)}
# backend -> model-parallel dimensions it implements (data parallelism is always there), and why not
# the others. Megatron's context parallelism needs TransformerEngine's attention, which the local
# layer spec does not use (trainer/megatron/parallel.py).
MODEL_PARALLEL_OF: dict[str, tuple[str, ...]] = {"megatron": ("tensor", "pipeline"), "torch": ()}
MODEL_PARALLEL_WHY_NOT: dict[str, str] = {
    "megatron": "context parallelism needs TransformerEngine's attention",
    "torch": "data parallel only",
}
# backend -> advantage estimators it trains (ppo needs a critic: both have one).
ESTIMATORS_OF: dict[str, tuple[str, ...]] = {"megatron": ESTIMATORS, "torch": ESTIMATORS}
# device -> most trainer nodes when colocated (None: any). On cuda the engines share the trainer's
# GPUs and get weights by CUDA IPC, which does not cross nodes; on cpu the weights travel over HTTP.
COLOCATED_MAX_NODES: dict[str, int | None] = {"cuda": 1, "cpu": None}
# mode -> whether async (generation of step k+1 overlapping training on step k) runs there.
ASYNC_IN: dict[str, bool] = {"colocated": False, "disaggregated": True}
# (device, mode) -> how weights reach the engines (rljob_runtime.sync.choose_transport).
WEIGHT_SYNC: dict[tuple[str, str], str] = {
    ("cuda", "colocated"): "CUDA IPC",
    ("cuda", "disaggregated"): "NCCL broadcast",
    ("cpu", "colocated"): "shared-memory file (one node) or tensors over HTTP",
    ("cpu", "disaggregated"): "shared-memory file (one node) or tensors over HTTP",
}


@dataclass(frozen=True)
class Limit:
    """One thing the runtime does not run yet. `cel` and `supported` are true when the spec is fine."""

    field: str  # relative to the spec, as the API server names it: ".training.dynamicBatch.enabled"
    what: str  # what is not supported, in the manifest's words
    instead: str  # what to do instead
    cel: str
    supported: Callable[[JobSpec], bool]

    @property
    def message(self) -> str:
        return f"{NOT_YET}: {self.what}; {self.instead}"

    def problem(self) -> str:
        """'spec.<field>: <message>', as `rljob-runtime validate` and the API server report it."""
        return f"spec{self.field}: {self.message}"

    def rule(self) -> Rule:
        return Rule(cel=self.cel, message=self.message, field=self.field, check=self.supported)


def _or(values: tuple[str, ...] | list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return " or ".join([", ".join(values[:-1]), values[-1]]) if len(values) > 1 else values[0]


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _device_limit(device: str) -> Limit:
    engines, backends = ENGINES_ON[device], BACKENDS_ON[device]
    return Limit(
        field=".resources.device",
        what=f"resources.device {device} with rollout.engine other than {_or(engines)} or "
        f"training.backend other than {_or(backends)}",
        instead=f"on {device} use rollout.engine {_or(engines)} and training.backend {_or(backends)}",
        cel=f"self.resources.device != '{device}' || (self.rollout.engine in {_cel_list(engines)} && "
        f"self.training.backend in {_cel_list(backends)})",
        supported=lambda s: (
            s.resources.device != device or (s.rollout.engine in engines and s.training.backend in backends)
        ),
    )


def _model_parallel_limit(backend: str) -> Limit:
    missing = tuple(d for d in MODEL_PARALLEL_DIMS if d not in MODEL_PARALLEL_OF[backend])
    elsewhere = [
        f"training.backend {b} runs {_or(tuple(d for d in missing if d in MODEL_PARALLEL_OF[b]))} parallelism"
        for b in BACKENDS
        if b != backend and set(missing) & set(MODEL_PARALLEL_OF[b])
    ]
    return Limit(
        field=".training.parallelism",
        what=f"training.parallelism {_or(missing)} above 1 with training.backend {backend} "
        f"({MODEL_PARALLEL_WHY_NOT[backend]})",
        instead=f"set {'them' if len(missing) > 1 else 'it'} to 1"
        + (f" ({'; '.join(elsewhere)})" if elsewhere else ""),
        cel=f"self.training.backend != '{backend}' || ("
        + " && ".join(f"self.training.parallelism.{d} == 1" for d in missing)
        + ")",
        supported=lambda s: (
            s.training.backend != backend or all(getattr(s.training.parallelism, d) == 1 for d in missing)
        ),
    )


def _estimator_limit(backend: str) -> Limit:
    missing = tuple(e for e in ESTIMATORS if e not in ESTIMATORS_OF[backend])
    can = [b for b in BACKENDS if set(missing) <= set(ESTIMATORS_OF[b])]
    return Limit(
        field=".algorithm.advantageEstimator",
        what=f"algorithm.advantageEstimator {_or(missing)} with training.backend {backend} (no critic there)",
        instead=f"use training.backend {_or(can)}",
        cel=f"self.training.backend != '{backend}' || !(self.algorithm.advantageEstimator in "
        f"{_cel_list(missing)})",
        supported=lambda s: s.training.backend != backend or s.algorithm.advantage_estimator not in missing,
    )


def _colocated_nodes_limit(device: str, most: int) -> Limit:
    return Limit(
        field=".resources.colocate",
        what=f"resources.colocate true with more than {most} trainer node on {device} (CUDA IPC does not "
        "cross nodes, and an engine sharing a GPU with a trainer rank cannot join its NCCL group)",
        instead=f"use at most {most} trainer node, or resources.colocate false (engines on their own "
        "GPUs, synced by NCCL)",
        cel=f"self.resources.device != '{device}' || !self.resources.colocate || "
        f"self.resources.trainer.nodes <= {most}",
        supported=lambda s: (
            s.resources.device != device or not s.resources.colocate or s.resources.trainer.nodes <= most
        ),
    )


def _mode(spec: JobSpec) -> str:
    return "colocated" if spec.resources.colocate else "disaggregated"


_MODE_CEL = {"colocated": "self.resources.colocate", "disaggregated": "!self.resources.colocate"}


def _async_limit(mode: str) -> Limit:
    other = next(m for m in MODES if ASYNC_IN[m])
    return Limit(
        field=".rollout.async.enabled",
        what=f"rollout.async.enabled when {mode} (colocated engines and trainer take turns on the same "
        "GPUs, so generation cannot overlap training)",
        instead=f"run {other} (resources.colocate {str(other == 'colocated').lower()}), or set "
        "rollout.async.enabled false",
        cel=f"!self.rollout.async.enabled || !({_MODE_CEL[mode]})",
        supported=lambda s: not (s.rollout.async_.enabled and _mode(s) == mode),
    )


# The one SGLang flag the hf engine reads (as its batch size), in both spellings.
HF_SGLANG_ARGS = ("max-running-requests", "max_running_requests")

# Fields the API keeps for features to come; only their defaults run today.
FEATURES_NOT_YET: tuple[Limit, ...] = (
    Limit(
        field=".training.megatronArgs",
        what="training.megatronArgs with training.backend torch (they are Megatron options)",
        instead="use training.backend megatron, or remove it",
        cel="size(self.training.megatronArgs) == 0 || self.training.backend == 'megatron'",
        supported=lambda s: not s.training.megatron_args or s.training.backend == "megatron",
    ),
    Limit(
        field=".training.fusions",
        what="training.fusions with training.backend torch (they are the megatron backend's model fusions)",
        instead="use training.backend megatron, or remove it",
        cel="!has(self.training.fusions) || self.training.backend == 'megatron'",
        supported=lambda s: s.training.fusions is None or s.training.backend == "megatron",
    ),
    Limit(
        field=".training.lmHead",
        what="training.lmHead with training.backend torch (it is the megatron backend's LM head)",
        instead="use training.backend megatron, or remove it",
        cel="!has(self.training.lmHead) || self.training.backend == 'megatron'",
        supported=lambda s: s.training.lm_head is None or s.training.backend == "megatron",
    ),
    # Expert parallelism runs in the megatron backend on CPU ranks only (tests/unit/test_megatron_moe_rank.py,
    # gloo and the allgather token dispatcher), and the megatron backend is not admitted on device cpu;
    # on GPUs (the alltoall dispatcher) it has not run yet: tests/gpu/test_megatron_ep_gpu.py (2 GPUs) is
    # written for that, not run. The torch backend has none.
    Limit(
        field=".training.parallelism.expert",
        what="training.parallelism.expert above 1 (expert parallelism is not yet shown on GPUs: it has "
        "run only on CPU ranks in tests; training.backend torch has none)",
        instead="leave it 1: training.backend megatron builds MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral) at expert 1, every "
        "rank holding every expert",
        cel="self.training.parallelism.expert == 1",
        supported=lambda s: s.training.parallelism.expert == 1,
    ),
    # Rollout routing replay: SGLang returns the routed experts (--enable-return-routed-experts) and
    # megatron-core's RouterReplay replays them (trainer/megatron/routing_replay.py). Shown on CPU ranks
    # (tests/unit/test_megatron_routing_replay.py) and against SGLang's source; its requests go to the
    # engines directly (sglang-router 0.3.2 drops return_routed_experts: tests/integration/
    # test_router_request_fields.py). tests/gpu/test_routing_replay_gpu.py has not run yet. The limits
    # after this one stay when this one goes; until then it speaks only where none of them does (one
    # reason per spec, the most specific).
    Limit(
        field=".training.routingReplay",
        what="training.routingReplay (routing replay is not yet shown on GPUs: the megatron backend has "
        "replayed routing records only on CPU ranks in tests)",
        instead="set it false",
        cel="!self.training.routingReplay || self.training.backend != 'megatron' || "
        "self.rollout.engine != 'sglang' || has(self.rollout.customGenerate) || self.rollout.partialRollout || "
        "(self.training.recomputeActivations && self.training.parallelism.pipeline > 1)",
        supported=lambda s: (
            not s.training.routing_replay
            or s.training.backend != "megatron"
            or s.rollout.engine != "sglang"
            or s.rollout.custom_generate is not None
            or s.rollout.partial_rollout
            or (s.training.recompute_activations and s.training.parallelism.pipeline > 1)
        ),
    ),
    Limit(
        field=".training.routingReplay",
        what="training.routingReplay with training.backend torch or rollout.engine hf (the megatron "
        "backend replays routes that SGLang returns; the torch backend and the hf engine have neither)",
        instead="use training.backend megatron and rollout.engine sglang, or set it false",
        cel="!self.training.routingReplay || (self.training.backend == 'megatron' && "
        "self.rollout.engine == 'sglang')",
        supported=lambda s: (
            not s.training.routing_replay
            or (s.training.backend == "megatron" and s.rollout.engine == "sglang")
        ),
    ),
    Limit(
        field=".training.routingReplay",
        what="training.routingReplay with rollout.customGenerate (a hook's turns and tool outputs have no "
        "routing record of the whole sequence)",
        instead="remove rollout.customGenerate, or set training.routingReplay false",
        cel="!self.training.routingReplay || !has(self.rollout.customGenerate)",
        supported=lambda s: not s.training.routing_replay or s.rollout.custom_generate is None,
    ),
    Limit(
        field=".training.routingReplay",
        what="training.routingReplay with rollout.partialRollout (SGLang returns a routing record only "
        "with a finished answer: a partial response that already holds its whole budget ends without one)",
        instead="set rollout.partialRollout false, or training.routingReplay false",
        cel="!self.training.routingReplay || !self.rollout.partialRollout",
        supported=lambda s: not s.training.routing_replay or not s.rollout.partial_rollout,
    ),
    Limit(
        field=".training.routingReplay",
        what="training.routingReplay with recomputeActivations and training.parallelism.pipeline above 1 "
        "(the pipeline's recomputation in backward would replay another micro-batch's routes)",
        instead="set training.recomputeActivations false or training.parallelism.pipeline 1",
        cel="!self.training.routingReplay || !self.training.recomputeActivations || "
        "self.training.parallelism.pipeline == 1",
        supported=lambda s: (
            not s.training.routing_replay
            or not s.training.recompute_activations
            or s.training.parallelism.pipeline == 1
        ),
    ),
    # Sequence parallelism (megatron-core's, over the tensor-parallel ranks; trainer/megatron/norms.py
    # marks the norms it needs): shown on CPU ranks (tests/unit/test_megatron_sequence_parallel.py), not
    # on GPUs yet. The two limits after this one stay when it goes; until then it speaks only where
    # neither does. MoE models refuse tensor parallelism, so it too (trainer/megatron/parallel.py).
    Limit(
        field=".training.parallelism.sequenceParallel",
        what="training.parallelism.sequenceParallel (sequence parallelism is not yet shown on GPUs: the "
        "megatron backend has run it only on CPU ranks in tests)",
        instead="leave it false",
        cel="!self.training.parallelism.sequenceParallel || self.training.parallelism.tensor == 1 || "
        "self.algorithm.advantageEstimator == 'ppo'",
        supported=lambda s: (
            not s.training.parallelism.sequence_parallel
            or s.training.parallelism.tensor == 1
            or s.algorithm.advantage_estimator == "ppo"
        ),
    ),
    Limit(
        field=".training.parallelism.sequenceParallel",
        what="training.parallelism.sequenceParallel at training.parallelism.tensor 1 (it splits each "
        "sequence over the tensor-parallel ranks of training.backend megatron)",
        instead="set training.parallelism.tensor above 1, or leave it false",
        cel="!self.training.parallelism.sequenceParallel || self.training.parallelism.tensor > 1",
        supported=lambda s: not s.training.parallelism.sequence_parallel or s.training.parallelism.tensor > 1,
    ),
    Limit(
        field=".training.parallelism.sequenceParallel",
        what="training.parallelism.sequenceParallel with algorithm.advantageEstimator ppo (the critic under "
        "sequence parallelism is not tested yet)",
        instead="leave it false for ppo",
        cel="!self.training.parallelism.sequenceParallel || self.algorithm.advantageEstimator != 'ppo'",
        supported=lambda s: (
            not s.training.parallelism.sequence_parallel or s.algorithm.advantage_estimator != "ppo"
        ),
    ),
    Limit(
        field=".resources.rollout.gpusPerEngine",
        what="resources.rollout.gpusPerEngine above 1 with rollout.engine hf on cuda (an hf engine runs on "
        "one GPU)",
        instead="set it to 1 (one hf engine per GPU), or use rollout.engine sglang for tensor-parallel engines",
        cel="self.resources.device != 'cuda' || self.rollout.engine != 'hf' || "
        "self.resources.rollout.gpusPerEngine == 1",
        supported=lambda s: (
            s.resources.device != "cuda"
            or s.rollout.engine != "hf"
            or s.resources.rollout.gpus_per_engine == 1
        ),
    ),
    Limit(
        field=".rollout.sglangArgs",
        what="rollout.sglangArgs other than max-running-requests with rollout.engine hf (the hf engine "
        "takes no other SGLang flag)",
        instead="remove them, or use rollout.engine sglang",
        cel=f"self.rollout.engine != 'hf' || self.rollout.sglangArgs.all(k, k in {_cel_list(HF_SGLANG_ARGS)})",
        supported=lambda s: (
            s.rollout.engine != "hf" or all(k in HF_SGLANG_ARGS for k in s.rollout.sglang_args)
        ),
    ),
    Limit(
        field=".model.dtype",
        what="model.dtype float16 with training.backend megatron (it trains without loss scaling, so "
        "float16 gradients would underflow)",
        instead="use bfloat16",
        cel="self.model.dtype != 'float16' || self.training.backend != 'megatron'",
        supported=lambda s: s.model.dtype != "float16" or s.training.backend != "megatron",
    ),
    Limit(
        field=".model.megatronCheckpoint",
        what="model.megatronCheckpoint with training.backend torch (it is a Megatron checkpoint)",
        instead="use training.backend megatron, or remove it (the torch trainer starts from model.path)",
        cel="!has(self.model.megatronCheckpoint) || self.training.backend == 'megatron'",
        supported=lambda s: s.model.megatron_checkpoint is None or s.training.backend == "megatron",
    ),
)


_COLOCATED_NODE_LIMITS = {
    device: _colocated_nodes_limit(device, most)
    for device, most in COLOCATED_MAX_NODES.items()
    if most is not None
}


def colocated_nodes_limit(device: str) -> Limit | None:
    """The limit on trainer nodes when colocated on `device` (weight sync checks it against where Ray
    actually placed the actors, too)."""
    return _COLOCATED_NODE_LIMITS.get(device)


def _combination_limits() -> tuple[Limit, ...]:
    out = [
        _device_limit(d)
        for d in DEVICES
        if set(ENGINES_ON[d]) != set(ENGINES) or set(BACKENDS_ON[d]) != set(BACKENDS)
    ]
    out += [
        _model_parallel_limit(b) for b in BACKENDS if set(MODEL_PARALLEL_OF[b]) != set(MODEL_PARALLEL_DIMS)
    ]
    out += [_estimator_limit(b) for b in BACKENDS if set(ESTIMATORS_OF[b]) != set(ESTIMATORS)]
    out += list(_COLOCATED_NODE_LIMITS.values())
    out += [_async_limit(m) for m in MODES if not ASYNC_IN[m]]
    return tuple(out)


LIMITS: tuple[Limit, ...] = _combination_limits() + FEATURES_NOT_YET
SUPPORT_RULES: tuple[Rule, ...] = tuple(limit.rule() for limit in LIMITS)


def unsupported(spec: JobSpec) -> list[str]:
    """'spec.<field>: not supported by this runtime yet: ...' for everything in `spec` this runtime
    does not run, in the API server's words (empty for a spec the API server admitted)."""
    return [limit.problem() for limit in LIMITS if not limit.supported(spec)]
