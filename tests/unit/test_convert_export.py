"""``rljob-runtime convert export``: a run's saved iteration as a Hugging Face directory. A
torch-backend iteration's model/ is copied and checked; a megatron-backend iteration (saved by a real
CPU trainer rank after one step) is converted from its dist/ and checked against its model/;
transformers loads the result. An incomplete or pruned step is refused naming the steps there, a
second run reuses its own result, and an OUT that is something else is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_convert_cli import LLAMA, write_model

from rljob_runtime.checkpoint import store
from rljob_runtime.convert_cli import main
from rljob_runtime.export import EXPORT_RECORD
from rljob_runtime.trainer.megatron.checkpoint import read_hf_state

REPO = Path(__file__).resolve().parents[2]


def torch_iteration(root: Path, step: int) -> Path:
    """A torch-backend save of ``step`` (model/, a rank's state, driver.json), through the store."""

    def write(directory: Path) -> None:
        write_model(directory / store.MODEL_DIR, LLAMA)
        torch.save({"optimizer": {}}, directory / "trainer_rank0.pt")
        store.write_driver_state(directory, {"step": step})

    return store.save(root, step, write, keep=0)


def last_err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.splitlines()[-1]


def test_a_torch_iteration_is_copied_checked_and_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    torch_iteration(root, 2)
    iteration = torch_iteration(root, 4)
    out = tmp_path / "exports" / "run" / "iter_0000004"  # parents are created
    argv = ["export", "--checkpoints", str(root), "--step", "4", "--out", str(out)]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip()
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert line == f"exported iter_0000004 (model) -> {out}: {record['summary']}"
    assert record["summary"].endswith("0 mismatches (atol 0)")
    assert (record["checkpoints"], record["step"], record["source"]) == (str(root.resolve()), 4, "model")
    saved = sorted(p.name for p in store.model_dir(iteration).iterdir())
    assert sorted(p.name for p in out.iterdir()) == sorted([*saved, EXPORT_RECORD])
    got, want = read_hf_state(out), read_hf_state(store.model_dir(iteration))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], t) for k, t in want.items())
    assert sorted(p.name for p in out.parent.iterdir()) == [".iter_0000004.lock", "iter_0000004"]

    # A retried job: nothing written.
    before = {p: p.stat().st_mtime_ns for p in [out, *out.iterdir()]}
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == f"reused {out}"
    assert {p: p.stat().st_mtime_ns for p in [out, *out.iterdir()]} == before

    # Another iteration to the same place, or a directory that is no export: refused.
    assert main([*argv[:4], "2", *argv[5:]]) == 1
    assert last_err(capsys) == (
        f"export failed: {out} exists and is not an export of iter_0000002 of {root} (it holds "
        f"iter_0000004 of {root.resolve()}): remove it or set checkpoint.export.path"
    )
    other = tmp_path / "other"
    other.mkdir()
    assert main([*argv[:6], str(other)]) == 1
    assert last_err(capsys).startswith(
        f"export failed: {other} exists and is not an export of iter_0000004 of {root} (it has no readable "
        f"{EXPORT_RECORD}): remove it or set checkpoint.export.path"
    )


def test_a_step_that_is_not_complete_is_refused_naming_the_steps_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    torch_iteration(root, 2)
    torch_iteration(root, 4)
    partial = store.iteration_dir(root, 5)
    write_model(partial / store.MODEL_DIR, LLAMA)  # a save that did not finish: no marker
    out = tmp_path / "out"
    steps = f"completed steps under {root}: 2, 4 (checkpoint.maxToKeep prunes older ones)"
    for step, why in (
        (5, f"{partial} has no complete marker (a save that did not finish)"),
        (1, f"{store.iteration_dir(root, 1)} does not exist"),
    ):
        assert main(["export", "--checkpoints", str(root), "--step", str(step), "--out", str(out)]) == 1
        assert last_err(capsys) == (
            f"export failed: iter_{step:07d} is not a complete checkpoint: {why}; {steps}"
        )
    assert main(["export", "--checkpoints", str(tmp_path / "none"), "--step", "1", "--out", str(out)]) == 1
    assert last_err(capsys).endswith(
        f"the checkpoint directory {tmp_path / 'none'} does not exist; completed steps under "
        f"{tmp_path / 'none'}: none (checkpoint.maxToKeep prunes older ones)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "ckpt"]  # nothing written


@pytest.mark.slow
def test_the_command_line_ends_with_the_reason(tmp_path: Path) -> None:
    """As the conversion job runs it: the last line of stdout and stderr together is the reason."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("runtime", "api"))}
    torch_iteration(tmp_path / "ckpt", 3)
    command = [sys.executable, "-m", "rljob_runtime.convert_cli", "export", "--checkpoints"]
    command += [str(tmp_path / "ckpt"), "--step", "9", "--out", str(tmp_path / "out")]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].startswith(
        "export failed: iter_0000009 is not a complete checkpoint: "
    ), done.stdout


# ------------------------------------------------------------------- a megatron-backend iteration


@pytest.fixture(scope="module")
def megatron_run(cpu_megatron: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A megatron trainer rank on CPU trains one step and saves it as the driver does (store.save):
    iter_0000001 with model/ and dist/."""
    from test_megatron_reshard import ADV, cpu_training, make_spec, step, trainer
    from test_megatron_reshard import write_model as write_untied

    from rljob_runtime.trainer.megatron.checkpoint_convert import undo_patches

    base = tmp_path_factory.mktemp("megatron-run")
    model = write_untied(base / "hf")
    undo = cpu_training()
    try:
        rank = trainer(make_spec(model), model)
        step(rank, ADV)
        weights = {k: v.detach().clone() for k, v in rank.named_tensors().items()}

        def write(directory: Path) -> None:
            rank.save(str(directory))
            store.write_driver_state(directory, {"step": 1})

        store.save(base / "ckpt", 1, write, keep=0)
    finally:
        undo_patches(undo)
    return {"base": base, "model": model, "root": base / "ckpt", "weights": weights}


@pytest.mark.slow
def test_a_megatron_iteration_is_converted_from_its_dist_checkpoint(
    megatron_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    transformers = pytest.importorskip("transformers")
    root, out = megatron_run["root"], megatron_run["base"] / "exports" / "iter_0000001"
    argv = ["export", "--checkpoints", str(root), "--step", "1", "--out", str(out)]
    assert main([*argv, "--model", str(megatron_run["model"])]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert line == f"exported iter_0000001 (dist) -> {out}: {record['summary']}"
    assert record["source"] == "dist" and record["summary"].count("0 mismatches (atol 0)") == 2
    assert "against dist/" in record["summary"] and "against model/" in record["summary"]

    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    trained, start = megatron_run["weights"], read_hf_state(megatron_run["model"])
    assert all(torch.equal(loaded[k], t) for k, t in trained.items())
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the step's weights, not model.path's

    assert main(argv) == 0 and capsys.readouterr().out.strip() == f"reused {out}"


def _copy_iteration(megatron_run: dict[str, Any], tmp_path: Path) -> tuple[Path, Path]:
    """The megatron run's iteration 1 copied into a checkpoint directory of the test's own."""
    import shutil

    root = tmp_path / "ckpt"
    iteration = store.iteration_dir(root, 1)
    shutil.copytree(store.iteration_dir(megatron_run["root"], 1), iteration)
    return root, iteration


@pytest.mark.slow
def test_a_dist_iteration_without_model_dir_needs_model(
    megatron_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    root, iteration = _copy_iteration(megatron_run, tmp_path)
    shutil.rmtree(store.model_dir(iteration))
    argv = ["export", "--checkpoints", str(root), "--step", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    assert last_err(capsys) == (
        f"export failed: {iteration} has no model/config.json: give --model (the job's model.path) "
        "for the config and tokenizer files"
    )
    assert main([*argv, "--model", str(megatron_run["model"])]) == 0
    record = json.loads((tmp_path / "out" / EXPORT_RECORD).read_text())
    assert "against model/" not in record["summary"]  # nothing to compare with but dist/
    got = read_hf_state(tmp_path / "out")
    assert all(torch.equal(got[k], t) for k, t in megatron_run["weights"].items())


@pytest.mark.slow
def test_a_model_dir_that_disagrees_with_dist_fails_naming_the_tensor(
    megatron_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file

    root, iteration = _copy_iteration(megatron_run, tmp_path)
    weights = store.model_dir(iteration) / "model.safetensors"
    state = load_file(str(weights))
    state["model.norm.weight"][0] += 1.0
    save_file(state, str(weights))
    out = tmp_path / "out"
    assert main(["export", "--checkpoints", str(root), "--step", "1", "--out", str(out)]) == 1
    last = last_err(capsys)
    assert last.startswith(f"export failed: export iter_0000001 -> {out}: against {iteration / 'model'}: ")
    assert "model.norm.weight: max abs diff 1 > 0" in last
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "ckpt"]  # no OUT, no staging
