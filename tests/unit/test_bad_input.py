"""Bad input is refused before training, by name: `rljob-runtime validate --prepare` runs the same
checks as `train` does before it starts Ray (spec rules, tokenizer, data, reward, hooks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_runtime.cli import main
from rljob_runtime.models.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", arch="llama", seed=0)


def write_job(tmp_path: Path, model: Path, rows: list[dict[str, Any]] | None, **sections: Any) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps(r) + "\n" for r in (rows if rows is not None else [{"prompt": "1+1", "label": "2"}])
        )
    )
    spec: dict[str, Any] = {
        "model": {"path": str(model)},
        "data": {"path": str(data), "applyChatTemplate": False},
        "rollout": {"engine": "hf", "batchSize": 1, "nSamplesPerPrompt": 2},
        "training": {"backend": "torch", "globalBatchSize": 2, "microBatchSize": 2},
        "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
    }
    for key, value in sections.items():
        spec.setdefault(key, {}).update(value)
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "rljob.dev/v1alpha1",
                "kind": "RLTrainingJob",
                "metadata": {"name": "bad"},
                "spec": spec,
            }
        )
    )
    return path


def validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", "--prepare", "-c", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_good_job_passes(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = validate(write_job(tmp_path, model, None), capsys)
    assert code == 0 and "valid; 1 prompts" in out, out


@pytest.mark.parametrize(
    ("sections", "rows", "expected"),
    [
        (
            {"algorithm": {"advantageEstimator": "grpoo"}},
            None,
            ["algorithm.advantageEstimator", "'grpo'", "'gspo'"],
        ),
        ({"reward": {"type": "mathh"}}, None, ["reward.type", "'math'", "'custom'"]),
        ({"data": {"labelKey": "answer"}}, None, ["data.jsonl line 1", "label key 'answer' missing"]),
        ({}, [], ["data.jsonl", "no prompts (the file is empty)"]),
        (
            {"reward": {"type": "custom", "function": "no_such_module_xyz:score"}},
            None,
            ["reward.function", "no_such_module_xyz"],
        ),
        (
            {"reward": {"type": "custom", "function": "json:no_such_function"}},
            None,
            ["reward.function", "no_such_function"],
        ),
    ],
    ids=[
        "unknown-estimator",
        "unknown-reward-type",
        "label-key-missing",
        "empty-dataset",
        "module-missing",
        "function-missing",
    ],
)
def test_bad_input_is_refused_by_name(
    model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sections: dict[str, Any],
    rows: Any,
    expected: list[str],
) -> None:
    import ray

    code, out = validate(write_job(tmp_path, model, rows, **sections), capsys)
    assert code == 2, out
    last = out.strip().splitlines()[-1]  # the operator shows the last line: it must say it all
    for text in expected:
        assert text in out, (text, out)
    assert last.startswith("rljob-runtime: invalid"), last
    assert not ray.is_initialized()
