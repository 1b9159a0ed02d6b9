"""The runtime validates config files with the CRD's rules and messages, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rljob_runtime import cli
from rljob_runtime.config import ConfigError, load_config

from spec_cases import BASE_SPEC, RULE_CASES, patched

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, doc: object, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_bare_spec_and_whole_manifest_are_both_accepted(tmp_path: Path) -> None:
    bare = load_config(_write(tmp_path, BASE_SPEC, "spec.yaml"))
    manifest = {
        "apiVersion": "rljob.dev/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": "a", "namespace": "ml"},
        "spec": BASE_SPEC,
    }
    whole = load_config(_write(tmp_path, manifest))
    assert bare.spec == whole.spec
    assert (whole.name, whole.namespace) == ("a", "ml") and bare.name is None


def test_multi_document_file_picks_the_job(tmp_path: Path) -> None:
    path = tmp_path / "all.yaml"
    job = {
        "apiVersion": "rljob.dev/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": "b"},
        "spec": BASE_SPEC,
    }
    path.write_text(
        yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}, job])
    )
    assert load_config(path).name == "b"


@pytest.mark.parametrize("case", RULE_CASES[:4], ids=lambda c: c.name)
def test_config_errors_use_the_crd_messages(tmp_path: Path, case) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, patched(case.patch)))
    assert any(p.startswith(case.path + ": ") and case.message in p for p in info.value.problems)


def test_wrong_kind_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kind: expected RLTrainingJob"):
        load_config(_write(tmp_path, {"apiVersion": "rljob.dev/v1alpha1", "kind": "Job", "spec": BASE_SPEC}))
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_a_manifest_without_its_header_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, {"metadata": {"name": "a"}, "spec": BASE_SPEC}))
    assert info.value.problems == [
        "a document with spec: but no apiVersion/kind: add 'apiVersion: rljob.dev/v1alpha1' and "
        "'kind: RLTrainingJob' (a manifest), or give the spec's fields at the top level (a bare spec)"
    ]


def test_cli_validate_ok_and_failure_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "-c", str(REPO / "examples/manifests/grpo-job.yaml")]) == 0
    out = capsys.readouterr().out
    assert "qwen3-4b-math: valid" in out and "TP 2 x PP 1 x CP 1 x DP 4" in out

    assert (
        cli.main(
            ["validate", "-c", str(_write(tmp_path, patched({"rollout": {"batchSize": 30, "engine": "x"}})))]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rljob-runtime: invalid config: spec.rollout.engine")
