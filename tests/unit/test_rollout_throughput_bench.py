"""The rollout throughput benchmark (benchmarks/gpu/rollout_throughput.py, its pure helpers in
throughput_report.py): workloads, rows, ratios, table, target line, JSON, the flags both stock and
runtime get; and (slow) the whole harness on CPU, rljob's hf server standing in for stock SGLang."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import rollout_throughput as bench
import throughput_report as tr


def workloads(requests: int = 256, new_tokens: int = 256, vocab: int = 49152) -> list[tr.Workload]:
    return tr.make_workloads(
        ["fixed", "longtail"], requests=requests, prompt_len=128, new_tokens=new_tokens, vocab=vocab
    )


# ------------------------------------------------------------------------------------- workloads


def test_fixed_asks_the_same_of_every_request() -> None:
    fixed = workloads()[0]
    assert fixed.requests == 256 and set(fixed.new_tokens) == {256} and fixed.output_tokens == 65_536
    assert fixed.by_length() == {256: list(range(256))}


def test_the_long_tail_is_five_percent_at_eight_times_the_median_and_the_same_every_time() -> None:
    tail = workloads()[1]
    assert statistics.median(tail.new_tokens) == 256
    assert sorted(set(tail.new_tokens)) == [256, 2048] and tail.new_tokens.count(2048) == 13  # round(12.8)
    assert tail.output_tokens == 243 * 256 + 13 * 2048
    assert workloads()[1].new_tokens == tail.new_tokens  # seeded: every mode and every invocation
    assert (
        tr.make_workloads(["longtail"], requests=256, prompt_len=4, new_tokens=256, vocab=99, seed=1)[
            0
        ].new_tokens
        != tail.new_tokens
    )
    assert tail.describe() | {"seed": 0} == {
        "name": "longtail",
        "requests": 256,
        "prompt_len": 128,
        "output_tokens": 88_832,
        "new_tokens_median": 256,
        "new_tokens_max": 2048,
        "long_requests": 13,
        "seed": 0,
    }
    groups = tail.by_length()
    assert len(groups[2048]) == 13 and sorted(groups[256] + groups[2048]) == list(range(256))
    few = tr.long_tail_lengths(4, 8)  # at least one long request
    assert sorted(few) == [8, 8, 8, 64]
    with pytest.raises(ValueError, match="fraction"):
        tr.long_tail_lengths(10, 8, fraction=0.5)


def test_prompts_are_fresh_for_each_run_but_the_same_for_every_mode() -> None:
    fixed, tail = workloads()
    first = fixed.prompts(0)
    assert len(first) == 256 and {len(p) for p in first} == {128}
    assert all(100 <= t < 49152 for p in first for t in p)
    assert workloads()[0].prompts(0) == first  # another mode, another process: the same draw
    assert fixed.prompts(1) != first and tail.prompts(0) != first  # no run finds its prompts cached
    warm = tr.warmup_workload(128, 49152)
    assert warm.requests == 8 and warm.prompts(0) != first[:8]
    assert all(
        0 <= t < 10 for p in tr.draw_prompts(3, 5, 10, seed=0) for t in p
    )  # tiny vocab: from vocab // 2


def test_bad_workloads_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        tr.make_workloads(["bursty"], requests=4, prompt_len=4, new_tokens=4, vocab=1000)
    with pytest.raises(ValueError, match="positive"):
        tr.make_workloads(["fixed"], requests=0, prompt_len=4, new_tokens=4, vocab=1000)


# ----------------------------------------------------------------------- rows, ratios, table, target


def rows_of(runtime_seconds: list[float]) -> list[dict]:
    fixed = tr.make_workloads(["fixed"], requests=4, prompt_len=4, new_tokens=10, vocab=1000)[0]
    common = dict(model="0.5b", engine="sglang", workload=fixed)
    return [
        tr.row("stock", client="concurrent", seconds=[1.0, 2.0], **common),
        tr.row("stock", client="batch", seconds=[1.25, 1.25], **common),
        tr.row("stock", client="concurrent+logprobs", reference=False, seconds=[0.5, 0.5], **common),
        tr.row("runtime", seconds=runtime_seconds, **common),
    ]


def test_a_row_keeps_every_run_the_best_and_the_median() -> None:
    stock = rows_of([1.0])[0]
    assert stock["seconds"] == [1.0, 2.0] and stock["best_s"] == 1.0 and stock["median_s"] == 1.5
    assert stock["tok_per_s"] == 40.0 and stock["tok_per_s_median"] == pytest.approx(40 / 1.5)
    assert stock["reference"] is True and rows_of([1.0])[3]["reference"] is None
    with pytest.raises(ValueError, match="no positive timings"):
        tr.row("runtime", model="m", engine="hf", workload=tr.warmup_workload(4, 99), seconds=[])


def test_the_better_stock_client_is_the_reference_and_logprobs_rows_never_are() -> None:
    rows = tr.with_ratios(rows_of([1.05, 1.2]))
    assert [r["is_reference"] for r in rows] == [True, False, False, False]
    assert rows[1]["vs_stock"] == pytest.approx(0.8) and rows[1]["vs_stock_median"] == pytest.approx(1.2)
    assert rows[3]["vs_stock"] == pytest.approx(1 / 1.05, abs=1e-3)
    assert rows[3]["vs_stock_median"] == pytest.approx(1.5 / 1.125, abs=1e-3)
    alone = tr.with_ratios([rows_of([1.0])[3]])  # no stock figure: no ratio
    assert alone[0]["vs_stock"] is None and alone[0]["is_reference"] is False


def test_the_table_has_a_line_per_row_with_its_ratio_to_stock() -> None:
    table = tr.format_table(rows_of([1.05, 1.2])).splitlines()
    assert table[0].startswith("| mode | model | workload | requests | output tokens | seconds (each run) |")
    assert len(table) == 2 + 4
    assert (
        table[2] == "| stock/concurrent * | 0.5b | fixed | 4 | 40 | 1.00 / 2.00 | 40 | 27 | 1.000 | 1.000 |"
    )
    assert table[4].startswith("| stock/concurrent+logprobs | 0.5b |")
    assert table[5] == "| runtime | 0.5b | fixed | 4 | 40 | 1.05 / 1.20 | 38 | 36 | 0.952 | 1.333 |"
    earlier = {**rows_of([1.0])[1], "source": "earlier run"}
    assert tr.format_table([earlier]).splitlines()[2].startswith("| stock/batch (earlier) * |")


def test_the_target_line() -> None:
    assert tr.target_lines(rows_of([1.05, 1.2])) == [
        "runtime/stock >= 0.95: met (0.5b, fixed: 0.952 best of 2 runs, 1.333 median)"
    ]
    assert tr.target_lines(rows_of([1.06]))[0].startswith(
        "runtime/stock >= 0.95: missed (0.5b, fixed: 0.943 "
    )
    assert tr.target_lines(rows_of([1.0])[3:]) == [
        "runtime/stock >= 0.95: not measured (needs modes stock and runtime)"
    ]


def test_the_json_document(tmp_path: Path) -> None:
    doc = tr.report(
        rows_of([1.05]),
        workloads=workloads(),
        args={"model": "0.5b", "json": tmp_path / "t.json", "runs": 2, "modes": ["stock"]},
        extra={"gpu": "NVIDIA H100 80GB HBM3"},
    )
    tr.write_json(tmp_path / "sub" / "t.json", doc)
    back = json.loads((tmp_path / "sub" / "t.json").read_text())
    assert (
        back["benchmark"] == "rollout_throughput"
        and back["target"] == 0.95
        and back["gpu"].startswith("NVIDIA")
    )
    assert back["args"] == {
        "model": "0.5b",
        "json": str(tmp_path / "t.json"),
        "runs": 2,
        "modes": "['stock']",
    }
    assert [w["name"] for w in back["workloads"]] == ["fixed", "longtail"]
    assert back["rows"][3]["vs_stock"] == pytest.approx(0.952, abs=1e-3) and back["targets"][0].startswith(
        "runtime/stock >= 0.95: met"
    )


def test_stock_rows_come_from_an_earlier_run_of_the_same_load() -> None:
    fixed = tr.make_workloads(["fixed"], requests=4, prompt_len=4, new_tokens=10, vocab=1000)
    earlier = tr.report(rows_of([1.0]), workloads=fixed, args={})
    got = tr.stock_rows_from(earlier, model="0.5b", workloads=fixed)
    assert [tr.label(r) for r in got] == [
        "stock/concurrent (earlier)",
        "stock/batch (earlier)",
        "stock/concurrent+logprobs (earlier)",
    ]
    assert "vs_stock" not in got[0] and tr.references(got)[("0.5b", "fixed")] is got[0]
    other = tr.make_workloads(["fixed"], requests=8, prompt_len=4, new_tokens=10, vocab=1000)
    with pytest.raises(ValueError, match="8 requests"):
        tr.stock_rows_from(earlier, model="0.5b", workloads=other)
    with pytest.raises(ValueError, match=r"no stock rows for model .1\.5b."):
        tr.stock_rows_from(earlier, model="1.5b", workloads=fixed)


# --------------------------------------------------------------------------------- the script's flags


def test_defaults_full_and_tiny() -> None:
    full = bench.parse_args([])
    assert (full.model, full.prompts, full.prompt_len, full.new_tokens) == ("0.5b", 2048, 128, 256)
    assert full.engine == "sglang" and full.modes == ["stock", "runtime", "hf"] and full.runs == 3
    assert full.stock_plain is True and full.also_concurrency == []
    assert bench.parse_args(["--no-stock-plain", "--also-concurrency", "512", "1024"]).also_concurrency == [
        512,
        1024,
    ]
    tiny = bench.parse_args(["--device", "cpu", "--tiny", "--prompts", "6"])
    assert (tiny.model, tiny.prompts, tiny.prompt_len, tiny.new_tokens) == ("tiny", 6, 8, 8)
    assert tiny.engine == "hf" and tiny.modes == ["stock", "runtime"]
    assert bench.parse_args(["--device", "cpu", "--engine", "hf", "--modes", "runtime", "hf"]).modes == [
        "runtime"
    ]
    for bad in (
        ["--device", "cpu", "--engine", "sglang"],
        ["--prompts", "0"],
        ["--also-concurrency", "0"],
        ["--stock-from", "x.json"],  # with mode stock
        ["--sglang-arg", "port=1"],  # the runtime owns it: refused before anything starts
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


@pytest.mark.parametrize("placement", ["colocated", "rollout"])
def test_stock_and_runtime_get_the_same_sglang_flags(placement: str) -> None:
    args = bench.parse_args(["--placement", placement, "--sglang-arg=--cuda-graph-max-bs-decode=256"])
    args.sglang_arg.append("attention-backend=flashinfer")
    args.mem_fraction = 0.7
    flags = bench.sglang_args(args)
    assert flags["attention-backend"] == "flashinfer" and flags["sampling-backend"] == "pytorch"
    assert flags["mem-fraction-static"] == "0.7" and flags["cuda-graph-max-bs-decode"] == "256"
    spec = bench.job_spec(args, Path("/m"), "sglang")
    assert spec.rollout.sglang_args == flags and spec.resources.colocate == (placement == "colocated")
    assert spec.fault_tolerance.engine_health_check.enabled is False
    assert spec.rollout.temperature == 1.0 and spec.rollout.top_p == 1.0 and spec.model.dtype == "bfloat16"
    assert bench.memory_saver(args) == (placement == "colocated")  # as RolloutManager.create


def test_the_stock_client_sends_what_the_runtime_sends_and_checks_every_length() -> None:
    from rljob_runtime.rollout.generate import sampling_params_from_spec

    spec = bench.job_spec(bench.parse_args([]), Path("/m"), "sglang")
    runtime = sampling_params_from_spec(
        spec.rollout, max_new_tokens=7, ignore_eos=True, temperature=1.0, top_p=1.0, top_k=-1
    )
    stock = bench.sampling_params(7, 1.0)
    assert {k: runtime[k] for k in stock} == stock
    assert set(runtime) - set(stock) <= {"skip_special_tokens", "no_stop_trim"}  # SGLang's defaults
    assert runtime["skip_special_tokens"] is True and runtime["no_stop_trim"] is False
    assert bench.completion_tokens({"meta_info": {"completion_tokens": 3}}) == 3
    assert bench.completion_tokens({"meta_info": {"output_token_logprobs": [[0, 1, None]] * 2}}) == 2
    assert bench.completion_tokens({"output_ids": [1], "meta_info": {}}) == 1
    bench.check_made("ok", [2, 3], [2, 3])
    with pytest.raises(RuntimeError, match=r"\(1, 2, 3\)"):
        bench.check_made("short", [2, 2], [2, 3])
    with pytest.raises(RuntimeError, match="1 answers for 2 requests"):
        bench.check_made("lost", [2], [2, 3])


# ----------------------------------------------------------------------------------- end to end, CPU


@pytest.mark.slow
def test_the_harness_runs_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--device cpu --engine hf --tiny``: the stock client against rljob's hf server (launched by
    the script with ``engine_command``, as stock SGLang would be), then the runtime's path (local
    Ray, RolloutManager, the real sglang-router, one hf engine)."""
    out = tmp_path / "t.json"
    argv = ["--device", "cpu", "--engine", "hf", "--tiny", "--runs", "2", "--also-concurrency", "2"]
    argv += ["--json", str(out)]
    assert bench.main([*argv, "--model-root", str(tmp_path), "--log-dir", str(tmp_path / "logs")]) == 0
    doc = json.loads(out.read_text())
    got = [(tr.label(r), r["workload"], r["output_tokens"]) for r in doc["rows"]]
    fixed, tail = 4 * 8, 3 * 8 + 64
    assert got == [
        ("stock/concurrent+logprobs", "fixed", fixed),
        ("stock/batch+logprobs", "fixed", fixed),
        ("stock/concurrent", "fixed", fixed),
        ("stock/concurrent+logprobs", "longtail", tail),
        ("stock/batch+logprobs", "longtail", tail),
        ("stock/concurrent", "longtail", tail),
        ("runtime", "fixed", fixed),
        ("runtime@2", "fixed", fixed),
        ("runtime", "longtail", tail),
        ("runtime@2", "longtail", tail),
    ]
    # the references ask logprobs, as the runtime does; the plain row never is one
    references = [r["client"] for r in doc["rows"] if r["is_reference"]]
    assert len(references) == 2 and set(references) <= {"concurrent+logprobs", "batch+logprobs"}
    # the hf server runs 64 requests at once (its batch), and the client read it
    assert doc["runtime_in_flight"] == 64
    assert all(len(r["seconds"]) == 2 and r["tok_per_s"] > 0 for r in doc["rows"])
    assert sum(r["is_reference"] for r in doc["rows"]) == 2
    assert (
        doc["stock_command"][1:3] == ["-m", "rljob_runtime.rollout.hf_server"] and doc["failed_modes"] == []
    )
    assert len(doc["targets"]) == 2 and all(t.startswith("runtime/stock >= 0.95: ") for t in doc["targets"])
    printed = capsys.readouterr().out
    assert "| runtime | tiny | longtail | 4 | 88 |" in printed and doc["targets"][1] in printed
