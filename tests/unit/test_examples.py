"""Every example manifest parses into the models and says what the README promises."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rljob_api.resource import parse_document

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "manifests"
MANIFESTS = sorted(EXAMPLES.glob("*.yaml"))


def _load(name: str):
    return parse_document(yaml.safe_load((EXAMPLES / name).read_text()))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_example_parses(path: Path) -> None:
    _, metadata = parse_document(yaml.safe_load(path.read_text()))
    assert metadata["name"]
    assert len(metadata["name"]) <= 47, "KubeRay limits RayJob names to 47 characters"


def test_the_expected_examples_exist() -> None:
    names = {p.name for p in MANIFESTS}
    assert {
        "grpo-job.yaml",
        "grpo-disaggregated.yaml",
        "grpo-async.yaml",
        "grpo-cpu-demo.yaml",
        "grpo-multiturn-tools.yaml",
    } <= names


def test_grpo_job_is_a_colocated_8_gpu_qwen3_4b_run() -> None:
    spec, _ = _load("grpo-job.yaml")
    assert "Qwen3-4B" in spec.model.path
    assert spec.algorithm.advantage_estimator == "grpo"
    assert spec.resources.colocate and spec.total_gpus() == 8
    assert spec.rollout.engine == "sglang" and spec.training.backend == "megatron"


def test_disaggregated_job_has_separate_rollout_gpus() -> None:
    spec, _ = _load("grpo-disaggregated.yaml")
    assert not spec.resources.colocate
    assert spec.resources.rollout.gpus == 8 and spec.total_gpus() == 16


def test_async_job_is_async_and_disaggregated() -> None:
    spec, _ = _load("grpo-async.yaml")
    assert spec.rollout.async_.enabled and not spec.resources.colocate


def test_cpu_demo_runs_without_gpus() -> None:
    spec, _ = _load("grpo-cpu-demo.yaml")
    assert spec.resources.device == "cpu" and spec.total_gpus() == 0
    assert spec.rollout.engine == "hf" and spec.training.backend == "torch"
    assert "SmolLM2-135M" in spec.model.path
    assert (EXAMPLES.parents[1] / spec.data.path).exists()


def test_multiturn_tools_example_runs_the_calculator_hook_on_cpu() -> None:
    spec, _ = _load("grpo-multiturn-tools.yaml")
    assert spec.resources.device == "cpu" and spec.total_gpus() == 0
    assert spec.rollout.engine == "hf" and spec.training.backend == "torch"
    assert "SmolLM2-135M" in spec.model.path
    assert spec.rollout.custom_generate == "calculator_tool:generate"
    repo = EXAMPLES.parents[1]
    assert (repo / spec.data.path).exists()
    # the runtime imports the hook from the PYTHONPATH the manifest gives every container
    pythonpath = {e.name: e.value for e in spec.resources.env}["PYTHONPATH"]
    assert pythonpath is not None and (repo / pythonpath / "calculator_tool.py").exists()


@pytest.mark.slow  # resolves SmolLM2 (a 15-40 s conversion the first time, then cached)
def test_multiturn_tools_example_validates_and_prepares(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    from rljob_runtime.cli import main
    from rljob_runtime.driver import prepare

    path = EXAMPLES / "grpo-multiturn-tools.yaml"
    assert main(["validate", "-c", str(path)]) == 0
    assert "generate hook calculator_tool:generate" in capsys.readouterr().out
    repo = EXAMPLES.parents[1]
    monkeypatch.chdir(repo)  # relative paths resolve against the working directory
    monkeypatch.syspath_prepend(str(repo / "examples" / "hooks"))  # what the manifest's PYTHONPATH does
    spec, _ = _load(path.name)
    prepared = prepare(spec)
    assert len(prepared.source) == 64 and prepared.dropped_prompts == 0
    first = prepared.source.next_batch(1)[0].to_samples(1)[0]
    assert first.prompt_ids and "<calc>12*7</calc>" in str(first.prompt)
    assert not ray.is_initialized()
