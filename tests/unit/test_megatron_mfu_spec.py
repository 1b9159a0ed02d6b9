"""benchmarks/gpu/megatron_mfu.py builds its model through a job's spec: each option becomes the spec
field a job sets (``spec_document``), the spec is admitted by the API's rules, and the megatron backend's
``model_options`` reads back what the option asked for (the build then is ``build_policy``, the
rank's own); ``--from-spec`` takes a manifest's fields, defaults included, and is forwarded to the
per-model processes. CPU only: the GPU run is the benchmark's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rljob_api.resource import parse_spec
from rljob_api.spec_training import MEGATRON_FUSIONS
from rljob_runtime.trainer.megatron.policy import model_options

REPO = Path(__file__).resolve().parents[2]
GPU_BENCH = REPO / "benchmarks" / "gpu"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("megatron_mfu_spec", GPU_BENCH / "megatron_mfu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def options_of(argv: list[str], world: int = 1) -> tuple[Any, Any]:
    args = bench.parse_args(argv)
    spec = bench.job_spec(args, world)
    return spec, model_options(spec)


def test_default_options_are_a_job_with_swiglu_only_and_the_full_head() -> None:
    spec, options = options_of([])
    assert options.fusions == {"swiglu"} and not options.chunked_head and options.recompute is None
    training = spec.training
    assert (training.micro_batch_size, training.global_batch_size) == (1, 4)  # --micro-batches 4
    assert training.parallelism.tensor == 1 and not training.offload_optimizer
    assert bench.spec_training_fields(spec)["lmHead"] == "full"


def test_the_measured_configuration_maps_to_the_job_fields() -> None:
    argv = ["--fusions", "wgrad,norm,rope", "--lm-head", "chunked", "--recompute", "full"]
    argv += ["--offload-optimizer", "--micro-batch-size", "2", "--micro-batches", "8"]
    spec, options = options_of(argv)
    assert options.fusions == set(MEGATRON_FUSIONS) and options.chunked_head and options.recompute == "full"
    assert spec.training.offload_optimizer and spec.training.global_batch_size == 16
    fields = bench.spec_training_fields(spec)
    assert fields["fusions"] == sorted(MEGATRON_FUSIONS) and fields["microBatchSize"] == 2
    # What a job writes to get it: the same fields parse to the same options.
    job = parse_spec(
        {
            "model": {"path": "/m"},
            "data": {"path": "/d.jsonl"},
            "rollout": {"batchSize": 16, "nSamplesPerPrompt": 1},
            "training": {
                "globalBatchSize": 16,
                "microBatchSize": 2,
                "recomputeActivations": True,
                "offloadOptimizer": True,
                "lmHead": "chunked",
            },
            "resources": {"trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )
    assert model_options(job) == options  # unset fusions: all four, as measured


@pytest.mark.parametrize(
    ("argv", "transformer", "recompute"),
    [
        (["--recompute", "selective"], {"recompute_granularity": "selective"}, None),
        (
            ["--recompute", "full", "--recompute-layers", "3"],
            {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 3},
            None,
        ),
        (["--recompute", "full"], {}, "full"),
        (["--swiglu", "unfused"], {}, None),
    ],
)
def test_recompute_options_become_megatron_args_or_recompute_activations(
    argv: list[str], transformer: dict[str, Any], recompute: str | None
) -> None:
    spec, options = options_of(argv)
    selective = transformer.get("recompute_granularity") == "selective"
    if selective:  # megatron_args fills the two others as TransformerConfig wants them
        transformer = {**transformer, "recompute_method": None, "recompute_num_layers": None}
    assert options.megatron.transformer == transformer and options.recompute == recompute
    assert bench.recompute_mode(spec) == (
        "full" if "--recompute-layers" in argv or recompute else "selective" if selective else None
    )
    if "--swiglu" in argv:
        assert options.fusions == frozenset()


def test_tensor_parallel_sets_the_layout_and_must_divide_the_ranks() -> None:
    spec, _ = options_of(["--tp", "2", "--models", "8b"], world=2)
    assert spec.training.parallelism.tensor == 2 and spec.resources.trainer.gpus_per_node == 2
    with pytest.raises(ValueError, match="--tp 2 does not divide the 3 ranks"):
        options_of(["--tp", "2", "--models", "8b"], world=3)


def test_from_spec_takes_a_manifest_with_its_defaults(tmp_path: Path) -> None:
    manifest = REPO / "examples" / "manifests" / "grpo-job.yaml"
    spec, options = options_of(["--from-spec", str(manifest), "--lm-head", "full"], world=2)
    assert options.fusions == set(MEGATRON_FUSIONS) and options.chunked_head  # the manifest's, not the flag's
    assert options.recompute == "full" and spec.training.parallelism.tensor == 2  # its recompute, tensor 2
    assert bench.spec_training_fields(spec)["lmHead"] == "chunked"
    with pytest.raises(ValueError, match=r"parallelism\.tensor 2 does not divide the 1 ranks"):
        options_of(["--from-spec", str(manifest)], world=1)
    args = bench.parse_args(["--from-spec", str(manifest), "--models", "1b,4b"])
    child = bench.parse_args([*bench.child_argv(args), "--models", "1b"])
    assert child.from_spec == manifest

    torch_job = tmp_path / "torch.yaml"
    torch_job.write_text(
        "model: {path: /m}\ndata: {path: /d.jsonl}\nrollout: {batchSize: 8, nSamplesPerPrompt: 1}\n"
        "training: {backend: torch, globalBatchSize: 8}\nresources: {trainer: {nodes: 1, gpusPerNode: 1}}\n"
    )
    with pytest.raises(ValueError, match=r"training\.backend torch; the benchmark times megatron"):
        options_of(["--from-spec", str(torch_job)])
    piped = tmp_path / "pp.yaml"
    piped.write_text(
        "model: {path: /m}\ndata: {path: /d.jsonl}\nrollout: {batchSize: 8, nSamplesPerPrompt: 1}\n"
        "training: {globalBatchSize: 8, parallelism: {pipeline: 2}}\n"
        "resources: {trainer: {nodes: 1, gpusPerNode: 2}}\n"
    )
    with pytest.raises(ValueError, match="tensor parallelism only"):
        options_of(["--from-spec", str(piped)], world=2)
