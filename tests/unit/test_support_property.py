"""Property: no spec the API server accepts is refused by the runtime's prepare from the spec alone.

Hypothesis generates specs across the support matrix's axes (device, engine, backend, colocated or
not, async, trainer nodes and GPUs, parallelism, estimator and the features not supported yet),
keeps those the Python models accept (the API server's verdict: test_cel_agrees_with_python holds
CEL and Python to the same answers) and runs on them everything `prepare` checks without files:
`check_spec` (the support matrix's `unsupported`, then the spec-wide rules), weight sync's
`check_supported`, and for megatron the layout check against a model whose shape every admitted
parallel size divides (the layout against a real model's config.json is a run-time check).
"""

from __future__ import annotations

from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rljob_api.errors import SpecError  # noqa: E402
from rljob_api.resource import parse_spec  # noqa: E402
from rljob_api.spec import RLTrainingJobSpec  # noqa: E402
from rljob_api.support import BACKENDS, DEVICES, ENGINES, ESTIMATORS  # noqa: E402
from rljob_runtime.prepare import check_spec  # noqa: E402
from rljob_runtime.sync import check_supported  # noqa: E402
from rljob_runtime.trainer.megatron.checks import check_layout  # noqa: E402

# A Qwen3-like model whose heads / KV heads / MLP / layers divide by every tensor and pipeline size
# generated below: a layout refused for it would be refused for the spec, not the model.
ROOMY_MODEL = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def rarely(value: Any, default: Any) -> st.SearchStrategy[Any]:
    """The default most of the time: a feature not supported yet would refuse nearly every spec."""
    return st.sampled_from([default] * 5 + [value])


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    device = draw(st.sampled_from(DEVICES))
    on_cpu = device == "cpu"  # cpu runs hf + torch only: aim there mostly, so some cpu specs pass
    engine = draw(rarely("sglang", "hf") if on_cpu else st.sampled_from(ENGINES))
    backend = draw(rarely("megatron", "torch") if on_cpu else st.sampled_from(BACKENDS))
    data_parallel_only = backend == "torch"
    colocate = draw(st.booleans())
    nodes = draw(st.sampled_from([1, 1, 2, 4]))
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    gpus = nodes * per_node
    tensor = draw(rarely(2, 1) if data_parallel_only else st.sampled_from([1, 1, 2, 4]))
    pipeline = draw(rarely(2, 1) if data_parallel_only else st.sampled_from([1, 1, 2, 3]))
    context = draw(rarely(2, 1))
    data_parallel = max(gpus // (tensor * pipeline * context), 1)
    micro = draw(st.sampled_from([1, 2]))
    global_batch = micro * data_parallel * draw(st.sampled_from([1, 2, 4]))
    n_samples = draw(st.sampled_from([1, 2, 4, 8]))
    batch = max(global_batch * draw(st.sampled_from([1, 2])) // n_samples, 1)
    spec: dict[str, Any] = {
        "model": {"path": "/models/roomy"},
        "data": {"path": "/data/train.jsonl"},
        "algorithm": {
            "advantageEstimator": draw(st.sampled_from(ESTIMATORS)),
            "dynamicSampling": {"enabled": draw(rarely(True, False))},
        },
        "rollout": {
            "engine": engine,
            "batchSize": batch,
            "nSamplesPerPrompt": n_samples,
            "partialRollout": draw(rarely(True, False)),
            "async": {"enabled": draw(st.booleans()), "bufferSize": draw(rarely(2, 1))},
        },
        "training": {
            "backend": backend,
            "globalBatchSize": global_batch,
            "microBatchSize": micro,
            "parallelism": {
                "tensor": tensor,
                "pipeline": pipeline,
                "context": context,
                "expert": draw(rarely(2, 1)),
                "sequenceParallel": draw(rarely(True, False)),
            },
            "dynamicBatch": {"enabled": draw(rarely(True, False))},
            "megatronArgs": draw(rarely({"overlap-grad-reduce": ""}, {})),
        },
        "resources": {
            "device": device,
            "colocate": colocate,
            "trainer": {"nodes": nodes, "gpusPerNode": per_node},
            "rollout": {
                "gpus": gpus if colocate else draw(st.sampled_from([1, 2, 4, 8, 16])),
                "gpusPerEngine": draw(st.sampled_from([1, 1, 2])),
                "gpusPerNode": 8,
            },
        },
        "checkpoint": {"export": {"huggingFace": draw(rarely(True, False))}},
        "faultTolerance": {"maxTrainerRestarts": draw(rarely(3, 0))},
    }
    if draw(rarely(True, False)):
        spec["model"]["megatronCheckpoint"] = "/ckpt/torch_dist"
    return spec


def _axes(spec: RLTrainingJobSpec) -> dict[str, Any]:
    return {
        "device": spec.resources.device,
        "engine": spec.rollout.engine,
        "backend": spec.training.backend,
        "colocate": spec.resources.colocate,
        "async": spec.rollout.async_.enabled,
        "nodes>1": spec.resources.trainer.nodes > 1,
        "tensor>1": spec.training.parallelism.tensor > 1,
        "pipeline>1": spec.training.parallelism.pipeline > 1,
        "estimator": spec.algorithm.advantage_estimator,
        "dynamicSampling": spec.algorithm.dynamic_sampling.enabled,
    }


def test_no_admitted_spec_is_refused_by_prepare() -> None:
    seen: dict[str, set[Any]] = {}

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,  # the same specs on every run: a failure reproduces
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
    )
    @given(specs())
    def admitted_specs_pass(doc: dict[str, Any]) -> None:
        try:
            spec = parse_spec(doc)
        except SpecError:
            assume(False)
            return
        for axis, value in _axes(spec).items():
            seen.setdefault(axis, set()).add(value)
        check_spec(spec)  # raises RunError naming what it refuses
        check_supported(spec)
        if spec.training.backend == "megatron":
            check_layout(spec, ROOMY_MODEL)

    admitted_specs_pass()
    # The property is only as good as the admitted specs it saw: every value of every axis occurred.
    assert seen == {
        "device": set(DEVICES),
        "engine": set(ENGINES),
        "backend": set(BACKENDS),
        "colocate": {True, False},
        "async": {True, False},
        "nodes>1": {True, False},
        "tensor>1": {True, False},
        "pipeline>1": {True, False},
        "estimator": set(ESTIMATORS),
        "dynamicSampling": {True, False},
    }
