"""W&B logging: the same per-step scalars as TensorBoard, a run named after the job, and never a
reason for training to stop. Runs real wandb in offline mode and reads its run file back."""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from rljob_demo.curve import read_scalars
from wandb_offline import history, run_file, run_info

from rljob_runtime.report import ProgressReporter, step_scalars
from rljob_runtime.wandb_log import RunIdentity, WandbLogger, init_arguments, wandb_wanted

pytest.importorskip("wandb")

UID = "7d9a4c1e-5b2f-4f0e-9a61-3c8e2b7f1d20"
JOB = RunIdentity("qwen-math", "ml", UID)
STEPS = [
    {"reward/mean": 0.125, "reward/std": 0.5, "response_length/mean": 31.0, "time/step": 12.3456},
    {"reward/mean": 0.25, "reward/std": 0.4375, "response_length/mean": 28.5, "time/step": 11.0},
    {"reward/mean": 0.4375, "reward/std": 0.375, "response_length/mean": 25.25, "time/step": 10.5},
]
EVAL = {2: {"gsm8k": 0.625, "aime": 0.0625}}


@pytest.fixture(autouse=True)
def _fresh_wandb() -> Any:
    """wandb reads its environment once per process (wandb.setup): tear it down between tests."""
    yield
    import wandb

    wandb.teardown()


@pytest.fixture
def wandb_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Offline W&B writing under tmp_path, with no W&B variable of the machine leaking in."""
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    return tmp_path / "wb"


def test_wandb_is_on_with_a_key_or_offline_mode_and_off_when_disabled() -> None:
    assert not wandb_wanted({})
    assert wandb_wanted({"WANDB_API_KEY": "k"})
    assert wandb_wanted({"WANDB_MODE": "offline"})
    assert not wandb_wanted({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"})
    assert not wandb_wanted({"WANDB_API_KEY": ""})


def test_the_run_is_named_after_the_job_and_wandb_variables_override() -> None:
    assert init_arguments(JOB, {}) == {
        "project": "rljob-ml",
        "name": "qwen-math",
        "id": UID,
        "resume": "allow",
    }
    assert init_arguments(JOB, {"WANDB_PROJECT": "p", "WANDB_NAME": "n", "WANDB_RUN_ID": "r"}) == {}
    assert init_arguments(RunIdentity(), {}) == {"project": "rljob"}  # a bare local spec


def test_scalars_are_the_metrics_and_the_eval_rewards() -> None:
    assert step_scalars({"reward/mean": 0.5}, {"gsm8k": 0.25}) == {
        "reward/mean": 0.5,
        "eval/gsm8k/reward": 0.25,
    }


def _report(tmp_path: Path, logger: WandbLogger | None) -> None:
    reporter = ProgressReporter(
        len(STEPS), job=None, tensorboard_dir=str(tmp_path / "tb"), stream=io.StringIO(), wandb=logger
    )
    for step, metrics in enumerate(STEPS, start=1):
        reporter.step(step, metrics, eval_rewards=EVAL.get(step))
    reporter.close()


def test_offline_run_holds_the_tensorboard_scalars_step_by_step(wandb_env: Path, tmp_path: Path) -> None:
    logger = WandbLogger.start(JOB, {"training": {"numRollout": len(STEPS)}})
    assert logger is not None
    _report(tmp_path, logger)

    tensorboard: dict[int, dict[str, float]] = {}
    for tag, series in read_scalars(tmp_path / "tb").items():
        for step, value in series:
            tensorboard.setdefault(step, {})[tag] = value
    # wandb's service process writes the run file: on a loaded machine the last records may land just
    # after finish() returned (seen once with both cores busy: an empty history). Read until they are there.
    deadline = time.monotonic() + 30
    while True:
        run = run_file(wandb_env)
        logged = history(run)
        if len(logged) >= len(STEPS) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(logged) == sorted(tensorboard) == [1, 2, 3]
    for step in logged:
        assert set(logged[step]) == set(tensorboard[step]), step
        # TensorBoard keeps float32; W&B the float64 the runtime logged
        assert logged[step] == pytest.approx(tensorboard[step], rel=1e-6), step
    assert logged[2]["eval/gsm8k/reward"] == 0.625 and "eval/gsm8k/reward" not in logged[1]
    info = run_info(run)
    assert (info.project, info.display_name, info.run_id) == ("rljob-ml", "qwen-math", UID)


class _FailingRunStandIn:
    """Stands in for a W&B run whose backend went away mid-run (not reproducible offline)."""

    id, project = "x", "p"

    def __init__(self) -> None:
        self.finished = 0

    def log(self, data: dict[str, Any], step: int) -> None:
        raise ConnectionError("wandb service is gone")

    def finish(self) -> None:
        self.finished += 1


def test_a_failing_log_turns_wandb_off_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _FailingRunStandIn()
    logger = WandbLogger(run)
    with caplog.at_level(logging.WARNING, "rljob.wandb"):
        _report(tmp_path, logger)  # three steps and close: no exception
    assert logger.run is None and run.finished == 1
    assert [r.getMessage() for r in caplog.records] == [
        "W&B is off for the rest of this run: logging step 1 failed: wandb service is gone"
    ]
    assert sorted(read_scalars(tmp_path / "tb")["reward/mean"]) == [
        (1, 0.125),
        (2, 0.25),
        (3, 0.4375),
    ]  # TensorBoard got every step


@pytest.mark.slow  # W&B gives up on an unreachable server after WANDB_INIT_TIMEOUT (5 s here)
def test_a_wandb_that_cannot_start_leaves_training_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, "rljob.wandb"):
        assert WandbLogger.start(JOB, {}) is None
    assert "W&B is off for this run: could not start a run" in caplog.text
