"""The colocated step benchmark (benchmarks/gpu/colocated_step.py): its job is one the API accepts,
and the phase table and the fit verdict read the driver's metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import colocated_step as bench

from rljob_api.resource import parse_spec


def test_the_job_is_valid_and_colocated_with_sglang() -> None:
    args = bench.parse_args(["--steps", "2"])
    spec = parse_spec(bench.job(args, Path("/m"), Path("/ckpt")))
    assert spec.resources.colocate and spec.rollout.engine == "sglang" and spec.training.num_rollout == 2
    assert spec.rollout.sglang_args["mem-fraction-static"] == "0.85"
    assert not spec.training.offload_optimizer and spec.training.recompute_activations
    big = parse_spec(
        bench.job(
            bench.parse_args(["--backend", "megatron", "--model", "4b", "--offload-optimizer"]),
            Path("/m"),
            Path("/c"),
        )
    )
    assert big.training.offload_optimizer and big.training.backend == "megatron"
    with pytest.raises(SystemExit):
        bench.parse_args(["--mem-fraction", "1.5"])


def test_the_checkpoint_never_goes_under_a_model_root_in_dev_shm(tmp_path: Path) -> None:
    """run.sh keeps its models in /dev/shm, a path the API refuses for checkpoints: the checkpoint
    directory is its own (a temporary one by default)."""
    args = bench.parse_args(["--model-root", "/dev/shm/rljob-models"])
    with pytest.raises(ValueError, match="/dev/shm"):
        parse_spec(bench.job(args, Path("/m"), args.model_root / "ckpt"))  # what it did before
    ckpt = bench.checkpoint_dir(args)
    assert ckpt.is_dir() and not str(ckpt).startswith("/dev/shm")
    parse_spec(bench.job(args, Path("/m"), ckpt))
    ckpt.rmdir()
    given = bench.parse_args(["--checkpoint-dir", str(tmp_path / "c")])
    assert bench.checkpoint_dir(given) == tmp_path / "c"


def test_phase_table_and_fit_verdict() -> None:
    history = [
        {
            "step": 1.0,
            "time/generate": 2.0,
            "time/release_engines": 0.5,
            "memory/release_engines/trainer_gb": 1.0,
            "memory/release_engines/engines_gb": 1.5,
            "time/onload_trainer": 0.4,
            "memory/onload_trainer/trainer_gb": 30.0,
            "memory/onload_trainer/trainer_peak_gb": 31.0,
            "memory/onload_trainer/engines_gb": 1.5,
            "time/sync": 0.2,
            "time/resume_engine_kv": 0.3,
            "memory/resume_engine_kv/trainer_gb": 1.0,
            "memory/resume_engine_kv/engines_gb": 66.0,
        }
    ]
    table = bench.phase_table(history)
    assert "| 1 | generate | 2.00 |  |  |  |" in table
    assert "| 1 | onload_trainer | 0.40 | 30.0 | 31.0 | 1.5 |" in table
    assert table.index("release_engines") < table.index("sync") < table.index("resume_engine_kv")
    assert bench.fit_line(history, 80.0).endswith("they do not fit at once")
    assert bench.fit_line(history, 141.0).endswith("they would fit at once")
    history[0]["memory/resume_engine_kv/engines_gb"] = -1.0
    assert "unknown" in bench.fit_line(history, 80.0)


def test_host_memory_columns_and_the_run_s_highest_host_figures() -> None:
    save = {
        "time/save": 40.0,
        "memory/save/trainer_gb": 29.0,
        "memory/save/trainer_host_rss_gb": 12.0,
        "memory/save/trainer_host_peak_rss_gb": 70.5,
        "memory/save/host_used_gb": 80.0,
        "memory/save/host_limit_gb": 128.0,
    }
    offload = {
        "time/offload_trainer": 0.2,
        "memory/offload_trainer/trainer_host_peak_rss_gb": 50.0,
        "memory/offload_trainer/host_used_gb": 95.0,
        "memory/offload_trainer/host_limit_gb": 128.0,
    }
    history = [{"step": 3.0, **save, **offload}]
    table = bench.phase_table(history)
    assert "| 3 | save | 40.00 | 29.0 |  |  | 12.0 | 70.5 | 80.0 / 128.0 |" in table
    assert table.index("| save |") < table.index("| offload_trainer |")
    assert bench.host_line(history) == (
        "host memory: trainer rank RSS peak 70.5 GB; host used at most 95.0 GB of 128.0 GB (74%, read after each phase)"
    )
    assert bench.host_line([{"step": 1.0, "time/generate": 1.0}]) == "host memory: not recorded"


def test_the_resumed_run_needs_the_first_run_s_checkpoint_and_trains_on_without_a_second_save() -> None:
    args = bench.parse_args(["--model", "4b", "--backend", "megatron", "--steps", "3", "--resume-steps", "1"])
    spec = parse_spec(bench.resume_job(args, Path("/m"), Path("/ckpt")))
    assert spec.checkpoint.resume == "required" and spec.checkpoint.path == "/ckpt"
    assert spec.training.num_rollout == 5  # 3 done + 1 trained + 1 it stops before (no second save)
    with pytest.raises(SystemExit):
        bench.parse_args(["--resume-steps", "-1"])
    with pytest.raises(SystemExit):  # a resume alone must name the earlier run's checkpoint
        bench.parse_args(["--resume-only", "--resume-steps", "1"])
    only = bench.parse_args(["--resume-only", "--resume-steps", "1", "--checkpoint-dir", "/tmp/c"])
    assert only.resume_only and bench.checkpoint_dir(only) == Path("/tmp/c")
