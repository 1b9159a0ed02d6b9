"""`rljob-runtime train` says by its exit status whether a restart can help: EXIT_NOT_RETRIABLE (78)
for an invalid config or a job `prepare` refuses, 1 for any other failure (once it runs, every
failure); the one-line reason is the last line either way (the operator shows it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rljob_api.resource import API_VERSION, KIND
from rljob_api.status import EXIT_NOT_RETRIABLE
from rljob_runtime import cli, driver
from rljob_runtime.data.prompts import DataError
from rljob_runtime.hub_rules import HubError
from rljob_runtime.models import ModelNotFoundError

from spec_cases import patched

CPU = {
    "model": {"path": "/nonexistent/model"},
    "rollout": {"engine": "hf"},
    "training": {"backend": "torch"},
    "resources": {"device": "cpu"},
}


def _config(tmp_path: Path, spec: dict) -> str:
    path = tmp_path / "job.yaml"
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "exits"}, "spec": spec}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _train(config: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["train", "--config", config, "--report-status", "off"])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture(autouse=True)
def _no_sigterm_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "unwind_on_sigterm", lambda: None)


def test_an_invalid_config_is_not_retriable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, last = _train(_config(tmp_path, patched({"rollout": {"batchSize": "32"}})), capsys)
    assert code == EXIT_NOT_RETRIABLE == 78
    assert last.startswith("rljob-runtime: invalid config: spec.rollout.batchSize")


def test_a_missing_local_model_is_refused_by_prepare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert code == EXIT_NOT_RETRIABLE
    assert last.startswith("rljob-runtime: failed: model.path '/nonexistent/model': no such local directory")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (driver.RunError("not supported by this runtime yet: x"), EXIT_NOT_RETRIABLE),
        (DataError("prompt data /d.jsonl: no such file"), EXIT_NOT_RETRIABLE),
        (ModelNotFoundError("model.path /m: no config.json"), EXIT_NOT_RETRIABLE),
        (HubError("model.path org/m@main: the hub is unreachable"), 1),  # may work a minute later
        (OSError("Input/output error"), 1),
        (RuntimeError("Ray could not start"), 1),
    ],
    ids=["run-error", "data", "local-model", "hub", "os-error", "runtime-error"],
)
def test_what_prepare_raises_decides_the_exit_status(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    expected: int,
) -> None:
    def prepare(spec: object) -> object:
        raise error

    monkeypatch.setattr(driver, "prepare", prepare)
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert code == expected
    assert last == f"rljob-runtime: failed: {error}"


@pytest.mark.parametrize(
    "error",
    [
        # e.g. faultTolerance.maxTrainerRestarts used up: a whole new Ray cluster may get past it
        driver.RunError("trainer rank 0 lost at step 3 and 1 of 1 trainer restarts used: node gone"),
        ValueError("a NaN in the loss"),
        OSError("No space left on device"),
    ],
    ids=["run-error", "value-error", "os-error"],
)
def test_once_running_every_failure_is_retriable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    class Prepared:
        dropped_prompts = 0

    def run(prepared: object, options: object) -> object:
        raise error

    monkeypatch.setattr(driver, "prepare", lambda spec: Prepared())
    monkeypatch.setattr(driver, "run", run)
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert (code, last) == (1, f"rljob-runtime: failed: {error}")
