"""`rljob-runtime train` says by its exit status whether a restart can help: EXIT_NOT_RETRIABLE (78)
for an invalid config, a job `prepare` refuses, or a configuration error met once it runs (in a Ray
actor or as the cause of another error too), 1 for any other failure; the one-line reason is the last
line either way (the operator shows it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rljob_api.errors import SpecError
from rljob_api.resource import API_VERSION, KIND
from rljob_api.status import EXIT_NOT_RETRIABLE, EXIT_PREEMPTED
from rljob_runtime import cli, driver, preemption
from rljob_runtime.data.prompts import DataError
from rljob_runtime.models.errors import ModelNotFoundError
from rljob_runtime.models.hub_rules import HubError
from rljob_runtime.run_error import RunError
from rljob_runtime.trainer.megatron.arch import UnsupportedModelError

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


class _Prepared:
    """What `train` reads of a prepared run before it calls `run` (which these tests replace)."""

    dropped_prompts = 0


@pytest.fixture(autouse=True)
def _no_sigterm_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "install", lambda: None)


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
        (RunError("not supported by this runtime yet: x"), EXIT_NOT_RETRIABLE),
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

    monkeypatch.setattr("rljob_runtime.prepare.prepare", prepare)
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert code == expected
    assert last == f"rljob-runtime: failed: {error}"


@pytest.mark.parametrize(
    "error",
    [
        # e.g. faultTolerance.maxTrainerRestarts used up: a whole new Ray cluster may get past it
        RunError("trainer rank 0 lost at step 3 and 1 of 1 trainer restarts used: node gone"),
        ValueError("a NaN in the loss"),
        OSError("No space left on device"),
    ],
    ids=["run-error", "value-error", "os-error"],
)
def test_once_running_every_failure_is_retriable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def run(prepared: object, options: object) -> object:
        raise error

    monkeypatch.setattr("rljob_runtime.prepare.prepare", lambda spec: _Prepared())
    monkeypatch.setattr(driver, "run", run)
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert (code, last) == (1, f"rljob-runtime: failed: {error}")


def test_a_preempted_run_exits_75_with_its_checkpoint_and_an_interrupted_one_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rljob_runtime.prepare.prepare", lambda spec: _Prepared())
    monkeypatch.setattr(
        driver,
        "run",
        lambda p, o: driver.RunResult(steps_done=3, last_checkpoint="/c/iter_0000003", preempted=True),
    )
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert (code, last) == (
        EXIT_PREEMPTED,
        "rljob-runtime: preempted after step 3; the job resumes from its checkpoint /c/iter_0000003",
    )

    def out_of_time(prepared: object, options: object) -> object:  # the watchdog interrupted the step
        preemption.current().request(0.0)
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "run", out_of_time)
    try:
        code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    finally:
        preemption.reset()
    assert code == EXIT_PREEMPTED
    assert last.startswith("rljob-runtime: preempted before the step in flight and its checkpoint were done")

    def interrupted(prepared: object, options: object) -> object:  # Ctrl-C: no SIGTERM came
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "run", interrupted)
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert code == 130 and last.startswith("rljob-runtime: interrupted")


class _RayTaskError(RuntimeError):
    """What Ray raises in the driver for an error in a task or actor: the original as `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"ray::TrainerRank.build() failed: {cause}")
        self.cause = cause


def _caused(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "error",
    [
        SpecError(["spec.training.globalBatchSize: must be a multiple of ..."]),
        DataError("prompt data /d.jsonl line 901: not JSON"),
        UnsupportedModelError(
            "model.path: architecture DeepseekV3ForCausalLM is not built by the megatron backend"
        ),
        ModelNotFoundError("model.path /m: no config.json on this node"),
        _RayTaskError(UnsupportedModelError("rope_type yarn is not built")),
        _caused(RunError("training.backend megatron: the model cannot be built"), DataError("x")),
    ],
    ids=["spec", "data", "unsupported-model", "local-model", "in-a-ray-actor", "as-the-cause"],
)
def test_a_configuration_error_is_final_even_once_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def run(prepared: object, options: object) -> object:
        raise error

    monkeypatch.setattr("rljob_runtime.prepare.prepare", lambda spec: _Prepared())
    monkeypatch.setattr(driver, "run", run)
    code, last = _train(_config(tmp_path, patched(CPU)), capsys)
    assert (code, last) == (EXIT_NOT_RETRIABLE, f"rljob-runtime: failed: {' '.join(str(error).split())}")


def test_a_hub_download_failing_once_running_is_retried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(prepared: object, options: object) -> object:
        raise HubError("model.path org/m@main: cannot reach the hub")

    monkeypatch.setattr("rljob_runtime.prepare.prepare", lambda spec: _Prepared())
    monkeypatch.setattr(driver, "run", run)
    assert _train(_config(tmp_path, patched(CPU)), capsys)[0] == 1


def test_a_config_that_cannot_be_read_is_final(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "job.yaml"
    config.write_bytes(b"\xff\xfe not text")
    code, last = _train(str(config), capsys)
    assert code == EXIT_NOT_RETRIABLE and last.startswith("rljob-runtime: invalid config: ")
