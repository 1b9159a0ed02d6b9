"""`rljob-runtime validate` gives the API server's verdicts on types and names: no string where a
number is due (no coercion), no number for a boolean, numbers read from YAML as kubectl reads them,
and metadata.name / metadata.namespace under Kubernetes' RFC 1123 rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_api.metadata import metadata_problems
from rljob_api.resource import API_VERSION, KIND, NAME_MAX, name_problem, parse_spec
from rljob_runtime.cli import main

from spec_cases import BASE_SPEC, patched


def _validate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    code = main(["validate", "-c", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _manifest(spec_yaml: str, metadata: str = "metadata: {name: qwen-math, namespace: ml}") -> str:
    return f"apiVersion: {API_VERSION}\nkind: {KIND}\n{metadata}\nspec:\n{spec_yaml}"


SPEC = """  model: {path: Qwen/Qwen3-4B}
  data: {path: /data/train.jsonl}
  rollout: {batchSize: 32, nSamplesPerPrompt: 8, temperature: 1}
  training:
    globalBatchSize: 256
    optimizer: {lr: 1e-6, minLr: 0}
"""


def test_numbers_as_kubectl_reads_them_are_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1e-6 is a float to kubectl (PyYAML alone reads a string); an integer is a valid number."""
    code, out = _validate(tmp_path, _manifest(SPEC), capsys)
    assert code == 0, out
    assert "qwen-math: valid" in out


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rollout": {"batchSize": "32"}}, "spec.rollout.batchSize"),
        ({"rollout": {"temperature": "0.7"}}, "spec.rollout.temperature"),
        ({"resources": {"colocate": 1}}, "spec.resources.colocate"),
        ({"suspend": "true"}, "spec.suspend"),
        ({"training": {"numRollout": 10.5}}, "spec.training.numRollout"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_not_coerced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], field: str
) -> None:
    code, out = _validate(tmp_path, yaml.safe_dump(patched(change)), capsys)
    assert code == 2
    assert out.strip().splitlines()[-1].startswith(f"rljob-runtime: invalid config: {field}: "), out


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        (
            "metadata: {name: Qwen_Math}",
            "metadata.name: Invalid value: 'Qwen_Math': a lowercase RFC 1123 subdomain",
        ),
        ("metadata: {name: qwen-math-}", "metadata.name: Invalid value: 'qwen-math-': a lowercase RFC 1123"),
        (
            "metadata: {name: qwen, namespace: ML}",
            "metadata.namespace: Invalid value: 'ML': a lowercase RFC 1123 label",
        ),
        ("metadata: {namespace: ml}", "metadata.name: Required value: name or generateName is required"),
    ],
)
def test_names_follow_the_api_servers_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], metadata: str, problem: str
) -> None:
    code, out = _validate(tmp_path, _manifest(SPEC, metadata), capsys)
    assert code == 2 and problem in out, out


def test_name_length_limits() -> None:
    """The API server's 253 for any object, then the CRD's own rule: the RayJob's limit."""
    assert metadata_problems({"name": "a" * NAME_MAX}) == []
    assert metadata_problems({"name": "a" * (NAME_MAX + 1)}) == [
        f"metadata.name: Invalid value: {'a' * (NAME_MAX + 1)!r}: {name_problem('a' * (NAME_MAX + 1))}"
    ]
    assert metadata_problems({"name": "a" * 254}) == [
        f"metadata.name: Invalid value: {'a' * 254!r}: must be no more than 253 characters"
    ]
    assert metadata_problems({"name": "a", "namespace": "n" * 64})[0].endswith("no more than 63 characters")


def test_a_bare_spec_has_no_metadata_to_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _validate(tmp_path, yaml.safe_dump(BASE_SPEC), capsys)
    assert code == 0, out


def test_objects_from_the_api_server_parse() -> None:
    """The operator parses what the API server sends: JSON, where a float of 1.0 arrives as 1."""
    served = json.loads(
        json.dumps(patched({"rollout": {"temperature": 1, "topP": 1}, "training": {"optimizer": {"lr": 1}}}))
    )
    spec = parse_spec(served)
    assert spec.rollout.temperature == 1.0 and isinstance(spec.rollout.temperature, float)
