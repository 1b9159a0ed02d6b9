"""The SGLang weight sync benchmark (benchmarks/gpu/sglang_weight_sync.py): its arguments, the
summary and table it prints, and the whole harness on CPU (hf engine, torch trainer, gloo)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import sglang_weight_sync as bench


def test_arguments_and_refusals() -> None:
    args = bench.parse_args([])
    assert (args.transport, args.models, args.reps, args.backend) == (
        "ipc",
        ["0.5b", "1.5b", "4b"],
        5,
        "megatron",
    )
    with pytest.raises(SystemExit):
        bench.parse_args(["--reps", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--bucket-mb", "-1"])
    cpu = bench.parse_args(["--cpu", "--models", "4b"])
    assert cpu.models == ["tiny"] and cpu.backend == "torch"


def test_the_job_a_run_would_have() -> None:
    ipc = bench.job_spec(bench.parse_args(["--transport", "ipc"]), Path("/m"))
    assert ipc.resources.colocate and ipc.rollout.engine == "sglang" and ipc.model.dtype == "bfloat16"
    assert ipc.rollout.sglang_args["attention-backend"] == "triton"
    nccl = bench.job_spec(bench.parse_args(["--transport", "nccl"]), Path("/m"))
    assert not nccl.resources.colocate and nccl.resources.rollout.gpus == 1


def test_summary_table_and_target() -> None:
    runs = [
        {"time/sync": 0.05, "sync/bytes": 8e9, "sync/buckets": 8.0, "time/sync_load": 0.03},
        {"time/sync": 0.04, "sync/bytes": 8e9, "sync/buckets": 8.0, "time/sync_load": 0.02},
        {"time/sync": 0.06, "sync/bytes": 8e9, "sync/buckets": 8.0, "time/sync_load": 0.04},
    ]
    summary = {"model": "4b", **bench.summarize(runs, 900.0)}
    assert summary["sync_ms"] == pytest.approx(50.0) and summary["gb_per_s"] == pytest.approx(160.0)
    assert summary["parts_ms"]["load"] == pytest.approx(30.0) and summary["parts_ms"]["share"] == 0.0
    table = bench.format_table("ipc", [summary])
    assert "| 4b | 8.00 | 8 | 50.0 | 160 | 900 |" in table
    assert bench.target_line("ipc", [summary]).endswith("160 GB/s, missed")
    assert bench.target_line("nccl", [summary]).endswith("160 GB/s, met")
    assert "not measured" in bench.target_line("ipc", [{**summary, "model": "0.5b"}])


@pytest.mark.slow
def test_the_harness_runs_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sync.json"
    code = bench.main(
        ["--cpu", "--transport", "nccl", "--reps", "2", "--json", str(out), "--model-root", str(tmp_path)]
    )
    assert code == 0
    import json

    (result,) = json.loads(out.read_text())["results"]
    assert result["model"] == "tiny" and result["bytes"] > 0 and len(result["sync_ms_all"]) == 2
    assert result["weight_version_after"] == "3" and result["engine_launches"] == [1]
    assert "| tiny |" in capsys.readouterr().out
