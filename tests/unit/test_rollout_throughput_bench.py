"""The rollout throughput benchmark (benchmarks/gpu/rollout_throughput.py): its workloads, table and
target line, and the whole harness on CPU (our hf server standing in for stock SGLang)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import rollout_throughput as bench


def test_workloads_share_prompts_and_the_long_tail_is_five_percent_at_eight_times() -> None:
    fixed, tail = bench.make_workloads(["fixed", "longtail"], 256, 128, 256, vocab=49152)
    assert fixed.prompts == tail.prompts and len(fixed.prompts) == 256 and len(fixed.prompts[0]) == 128
    assert set(fixed.new_tokens) == {256} and fixed.output_tokens == 256 * 256
    assert sorted(set(tail.new_tokens)) == [256, 2048] and tail.new_tokens.count(2048) == 13
    assert bench.make_workloads(["longtail"], 256, 128, 256, vocab=49152)[0].new_tokens == tail.new_tokens
    with pytest.raises(ValueError, match="unknown workload"):
        bench.make_workloads(["bursty"], 4, 4, 4, vocab=1000)


def test_table_ratio_and_target() -> None:
    fixed = bench.make_workloads(["fixed"], 4, 4, 10, vocab=1000)[0]
    rows = [bench.summarize("stock", fixed, [1.0, 2.0]), bench.summarize("runtime", fixed, [1.05, 1.2])]
    assert rows[0]["tok_per_s"] == 40.0 and rows[0]["tok_per_s_median"] == pytest.approx(40 / 1.5)
    table = bench.format_table("0.5b", rows)
    assert "| 0.5b | runtime | fixed | 4 | 40 | 1.05 / 1.20 | 38 | 0.952 |" in table
    assert bench.target_lines(rows) == ["target (runtime >= 95% of stock, fixed): 0.952, met"]
    rows[1] = bench.summarize("runtime", fixed, [1.2])
    assert bench.target_lines(rows)[0].endswith("missed")


def test_the_job_passes_the_same_sglang_flags_as_stock() -> None:
    args = bench.parse_args(["--sglang-arg", "cuda-graph-max-bs=256", "--mem-fraction", "0.7"])
    spec = bench.job(args, Path("/m"), "sglang")
    assert spec.rollout.sglang_args == bench.sglang_args(args)
    assert (
        spec.rollout.sglang_args["cuda-graph-max-bs"] == "256"
        and spec.rollout.sglang_args["mem-fraction-static"] == "0.7"
    )
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "0"])


@pytest.mark.slow
def test_the_harness_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    argv = ["--model", "tiny", "--device", "cpu", "--modes", "stock", "runtime", "--prompts", "4"]
    argv += ["--prompt-len", "6", "--new-tokens", "6", "--json", str(out), "--model-root", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["workload"]) for r in rows] == [
        ("stock", "fixed"),
        ("stock", "longtail"),
        ("runtime", "fixed"),
        ("runtime", "longtail"),
    ]
    assert all(r["output_tokens"] == (24 if r["workload"] == "fixed" else 6 * 3 + 48) for r in rows)
