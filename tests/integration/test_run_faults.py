"""Faults inside a run on a local Ray.

In-run trainer restarts (faultTolerance.maxTrainerRestarts): a trainer rank's
process is killed with SIGKILL while it trains; the driver restarts the trainer group from the
latest checkpoint and the run ends at the same step with the same batches, in order, as an
uninterrupted run (no batch skipped, none trained twice into the final model).

Colocated sync, disaggregated sync and async: the hf engines behind the real sglang-router keep
running through the restart and get the checkpoint's weights pushed.

Checkpoint faults: a save that fails with a full disk is dropped (the previous checkpoint stays the
latest), the run says so and goes on; what a crash mid-save left is removed before resuming."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rljob_api.resource import parse_spec
from rljob_runtime.checkpoint import store
from rljob_runtime.driver import RunOptions, run
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.prepare import prepare
from rljob_runtime.run_error import RunError
from rljob_runtime.trainer.group import TrainerGroup

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "add-1digit.jsonl"
STEPS = 4
KILL_AT_TRAIN_CALL = 4  # step 4: after the checkpoint of step 2 and a finished step 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", arch="llama", seed=0)


def spec_for(model: Path, ckpt: Path, *, colocate: bool, async_: bool, restarts: int) -> Any:
    resources: dict[str, Any] = {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}}
    if not colocate:
        resources.update(colocate=False, rollout={"gpus": 2, "gpusPerNode": 2})
    return parse_spec(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": str(DATA), "applyChatTemplate": False},
            "rollout": {
                "engine": "hf",
                "batchSize": 4,
                "nSamplesPerPrompt": 2,
                "maxResponseLen": 8,
                "async": {"enabled": async_},
            },
            "training": {
                "backend": "torch",
                "numRollout": STEPS,
                "globalBatchSize": 8,
                "microBatchSize": 2,
                "optimizer": {"lr": 1e-3},
            },
            "resources": resources,
            "reward": {"type": "math"},
            "checkpoint": {"path": str(ckpt), "saveInterval": 2, "maxToKeep": 2},
            "faultTolerance": {
                "engineHealthCheck": {"firstWaitSeconds": 60},
                "maxTrainerRestarts": restarts,
            },
        }
    )


class KillRankMidTrain:
    """SIGKILL of trainer rank 1's process right after the group submitted the ``call``-th train
    call to its ranks: the rank dies inside that step's training (the others wait on it in gloo)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, call: int, rank: int = 1) -> None:
        self.call, self.rank, self.calls = call, rank, 0
        self.killed: list[int] = []
        self._armed, self._pid = False, 0
        original_train, original_submit = TrainerGroup.train, TrainerGroup._submit
        chaos = self

        def train(group: TrainerGroup, *args: Any, **kwargs: Any) -> Any:
            chaos.calls += 1
            chaos._armed = chaos.calls == chaos.call
            if chaos._armed:
                chaos._pid = _pid(group.actors[chaos.rank])  # asked while the rank is idle
            return original_train(group, *args, **kwargs)

        def submit(group: TrainerGroup, calls: Any) -> Any:
            refs = original_submit(group, calls)
            if chaos._armed:
                chaos._armed = False
                os.kill(chaos._pid, signal.SIGKILL)
                chaos.killed.append(chaos._pid)
            return refs

        monkeypatch.setattr(TrainerGroup, "train", train)
        monkeypatch.setattr(TrainerGroup, "_submit", submit)


def _pid(actor: Any) -> int:
    import ray

    return int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=60))


@pytest.fixture(scope="module")
def data_order(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    """The prompt rows of each step of an uninterrupted run: the data source's order (the full-disk
    test below checks a real uninterrupted run against it)."""
    spec = spec_for(model_dir, tmp_path_factory.mktemp("order"), colocate=True, async_=False, restarts=0)
    source = prepare(spec).source
    return [sorted(p.index for p in source.next_batch(spec.rollout.batch_size)) for _ in range(STEPS)]


@pytest.mark.parametrize(
    ("colocate", "async_"),
    # Colocated async is refused at admission (the engines and the trainer take turns).
    [(True, False), (False, False), (False, True)],
    ids=["colocated-sync", "disaggregated-sync", "disaggregated-async"],
)
def test_killed_trainer_rank_restarts_from_checkpoint_with_the_same_batches(
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data_order: list[list[int]],
    colocate: bool,
    async_: bool,
) -> None:
    chaos = KillRankMidTrain(monkeypatch, call=KILL_AT_TRAIN_CALL)
    reported: list[float] = []
    spec = spec_for(model_dir, tmp_path / "ckpt", colocate=colocate, async_=async_, restarts=1)
    result = run(prepare(spec), RunOptions(on_step=lambda m: reported.append(m["step"])))

    assert len(chaos.killed) == 1
    assert result.steps_done == STEPS
    assert len(result.trainer_restarts) == 1
    message = result.trainer_restarts[0]
    assert "trainer restart 1 of 1: trainer rank 1 lost at step 4" in message
    assert "going on from step 2 with checkpoint" in message and "iter_0000002" in message
    # Steps 1, 2 (saved), 3; step 4 is lost; 3 and 4 are done again from step 2's checkpoint.
    assert reported == [1.0, 2.0, 3.0, 3.0, 4.0]
    assert [h["step"] for h in result.history] == [1.0, 2.0, 3.0, 4.0]
    # The prompts of every step, in order, are the uninterrupted run's: none skipped or repeated.
    assert result.batches == data_order
    assert store.completed_steps(tmp_path / "ckpt") == [2, 4]


def test_trainer_loss_beyond_max_trainer_restarts_fails_the_run(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    KillRankMidTrain(monkeypatch, call=1)
    spec = spec_for(model_dir, tmp_path / "ckpt", colocate=True, async_=False, restarts=0)
    with pytest.raises(
        RunError, match=r"trainer rank 1 lost at step 1 and faultTolerance.maxTrainerRestarts is 0"
    ):
        run(prepare(spec), RunOptions())


# ------------------------------------------------------------------------------ checkpoint faults


def test_a_full_disk_fails_one_save_and_the_run_goes_on(
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data_order: list[list[int]],
) -> None:
    ckpt = tmp_path / "ckpt"
    # A save a crash interrupted: a staging directory and an iteration without its marker.
    (store.staging_dir(ckpt, 9) / "model").mkdir(parents=True)
    store.iteration_dir(ckpt, 8).mkdir()
    spec = spec_for(model_dir, ckpt, colocate=True, async_=False, restarts=0)
    spec.checkpoint.save_interval = 1
    spec.checkpoint.max_to_keep = 0
    write_driver_state = store.write_driver_state

    def disk_full_at_step_2(directory: Path, state: dict[str, Any]) -> None:
        if state["step"] == 2:  # the trainer's files are written; the driver's state is not
            raise OSError(errno.ENOSPC, "No space left on device")
        write_driver_state(directory, state)

    monkeypatch.setattr(store, "write_driver_state", disk_full_at_step_2)
    result = run(prepare(spec), RunOptions())

    out = capsys.readouterr().out
    assert "removed an incomplete checkpoint" in out and ".staging-iter_0000009" in out
    assert (
        "checkpoint of step 2 failed, training goes on: checkpoint of step 2 not saved to "
        f"{store.iteration_dir(ckpt, 2)}: [Errno 28] No space left on device; the previous checkpoint "
        "(step 1) is kept"
    ) in out
    assert result.steps_done == STEPS and result.batches == data_order
    assert store.completed_steps(ckpt) == [1, 3, 4]
    left = sorted(p.name for p in ckpt.iterdir() if p.name != "tensorboard")
    assert left == ["iter_0000001", "iter_0000003", "iter_0000004"]
