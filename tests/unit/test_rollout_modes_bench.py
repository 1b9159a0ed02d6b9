"""The rollout-modes benchmark (benchmarks/gpu/rollout_modes.py, its pure helpers in
rollout_modes_report.py): every mode's spec parses and differs from sync only where it should; the
long-tail data; percentiles, GPU idle fractions and roles, the summaries, table, learning comparison,
target line and merged documents on made-up numbers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import keep_all_filter
import rollout_modes as bench
import rollout_modes_report as rm
from bench_env import KIT_SGLANG_ARGS

from rljob_api.resource import parse_spec


def cfg(**overrides: Any) -> rm.BenchConfig:
    return rm.BenchConfig(model="/models/smollm2", data="/data/modes.jsonl", workdir="/work", **overrides)


# ------------------------------------------------------------------------------------------- specs


@pytest.mark.parametrize("mode", rm.MODES)
def test_every_mode_parses_on_gpu_and_on_cpu(mode: str) -> None:
    spec = parse_spec(rm.mode_spec(mode, cfg()))
    assert spec.rollout.batch_size == 32 and spec.rollout.n_samples_per_prompt == 4
    assert spec.training.num_rollout == 9  # steps + 1: the runner stops after 8
    assert spec.resources.colocate is False and spec.resources.device == "cuda"
    assert spec.model.dtype == "bfloat16" and spec.training.backend == "torch"
    assert spec.rollout.sglang_args == {**KIT_SGLANG_ARGS, "mem-fraction-static": "0.7"}
    small = cfg(device="cpu", engine="hf", steps=2, batch=4, n=2, max_response_len=16)
    cpu = parse_spec(rm.mode_spec(mode, small))
    assert cpu.rollout.sglang_args == {} and cpu.model.dtype == "float32"
    assert cpu.training.global_batch_size == 8 and cpu.training.micro_batch_size == 8  # gcd(16, 8)


SYNC_ASYNC = ("rollout.async.enabled", (False, True))


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "one-step-off",
            {
                SYNC_ASYNC[0]: SYNC_ASYNC[1],
                "rollout.async.bufferSize": (None, 1),
                "rollout.async.updateWeightsInterval": (None, 1),
            },
        ),
        (
            "buffer2",
            {
                SYNC_ASYNC[0]: SYNC_ASYNC[1],
                "rollout.async.bufferSize": (None, 2),
                "rollout.async.updateWeightsInterval": (None, 2),
            },
        ),
        (
            "partial",
            {
                "algorithm.dynamicSampling.enabled": (None, True),
                "algorithm.dynamicSampling.overSamplingBatchSize": (None, 48),
                "rollout.customFilter": (None, "keep_all_filter:keep"),
                "rollout.partialRollout": (None, True),
            },
        ),
        (
            "partial-async",
            {
                "algorithm.dynamicSampling.enabled": (None, True),
                "algorithm.dynamicSampling.overSamplingBatchSize": (None, 48),
                "rollout.customFilter": (None, "keep_all_filter:keep"),
                "rollout.partialRollout": (None, True),
                SYNC_ASYNC[0]: SYNC_ASYNC[1],
                "rollout.async.bufferSize": (None, 1),
                "rollout.async.updateWeightsInterval": (None, 1),
            },
        ),
    ],
)
def test_each_mode_differs_from_sync_only_in_its_own_fields(mode: str, expected: dict[str, Any]) -> None:
    sync, other = rm.mode_spec("sync", cfg()), rm.mode_spec(mode, cfg())
    diff = rm.spec_differences(sync, other)
    assert diff.pop("checkpoint.path") == ("/work/ckpt-sync", f"/work/ckpt-{mode}")
    assert diff == expected
    parsed = parse_spec(other)  # and the parsed spec has what the mode means
    if mode in ("partial", "partial-async"):
        assert parsed.algorithm.dynamic_sampling.over_sampling_batch_size == 48  # ceil(1.5 x 32)
        assert parsed.rollout.partial_rollout and parsed.rollout.custom_filter == rm.FILTER_PATH


def test_parsed_sync_spec_is_synchronous_and_the_modes_differ_in_their_parsed_fields() -> None:
    specs = {m: parse_spec(rm.mode_spec(m, cfg())) for m in rm.MODES}
    assert not specs["sync"].rollout.async_.enabled and not specs["sync"].rollout.partial_rollout
    assert not specs["sync"].algorithm.dynamic_sampling.enabled
    assert not specs["partial"].rollout.async_.enabled
    assert [specs[m].rollout.async_.buffer_size for m in rm.MODES] == [1, 1, 2, 1, 1]
    assert [specs[m].rollout.async_.update_weights_interval for m in rm.MODES] == [1, 1, 2, 1, 1]
    assert rm.over_sampling_batch(cfg(batch=5)) == 8  # rounded up


def test_odd_sizes_still_parse_and_bad_ones_are_refused_before_anything_runs() -> None:
    parse_spec(rm.mode_spec("partial-async", cfg(batch=3, n=3, micro_batch=4, global_batch=9)))
    assert rm.BenchConfig("m", "d", "w", batch=3, n=3, micro_batch=4, global_batch=9).micro_batch_size == 1
    with pytest.raises(SystemExit):
        bench.parse_args(["--global-batch", "100"])  # 128 samples are not whole global batches of 100
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--engine", "sglang"])
    args = bench.parse_args(["--device", "cpu", "--modes", "sync", "partial", "--sglang-arg", "x=1"])
    assert args.engine == "hf" and args.modes == ["sync", "partial"]
    assert bench.config(args, Path("/w"), "/m").sglang_args == {"x": "1"}


def test_the_filter_keeps_every_group_and_loads_as_the_runtime_loads_it() -> None:
    from rljob_runtime.algo.group_filter import load_group_filter

    assert keep_all_filter.keep([]) is True
    assert load_group_filter(rm.FILTER_PATH).path == rm.FILTER_PATH


# -------------------------------------------------------------------------------------------- data


def test_the_data_has_five_percent_long_prompts_and_the_sums_as_labels() -> None:
    rows = rm.make_rows(1000, seed=0)
    long = [r for r in rows if r["metadata"]["long"]]
    assert len(rows) == 1000 and len(long) == 50
    for r in rows:
        a, b = r["metadata"]["a"], r["metadata"]["b"]
        assert 0 <= a <= 9 and 0 <= b <= 9 and r["label"] == str(a + b)
        template = rm.LONG_PROMPT if r["metadata"]["long"] else rm.SHORT_PROMPT
        assert r["prompt"] == template.format(a=a, b=b)
    assert rows == rm.make_rows(1000, seed=0)  # seeded
    assert rows != rm.make_rows(1000, seed=1)
    assert sum(r["metadata"]["long"] for r in rm.make_rows(10)) == 1  # at least one
    assert sum(r["metadata"]["long"] for r in rm.make_rows(100, long_fraction=0.0)) == 0
    # spread over the data, not bunched: every quarter has some
    assert all(any(r["metadata"]["long"] for r in rows[q : q + 250]) for q in range(0, 1000, 250))


def test_the_math_reward_scores_the_final_number_of_either_kind_of_answer() -> None:
    from rljob_runtime.data.rewards.math_answer import math_reward

    assert math_reward("12", "12") == 1.0
    assert math_reward("Count up from 5: 6, 7, 8. Checking again, 5 + 3 is 8.", "8") == 1.0
    assert math_reward("5 + 3 = 8, and 8 - 3 = 5", "8") == 0.0  # the last number counts


def test_the_data_file_parses_as_the_runtime_reads_it(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rljob_runtime.data.prompts import PromptSource
    from rljob_runtime.models.smollm2 import smollm2_tokenizer_dir

    path = rm.write_jsonl(tmp_path / "d.jsonl", rm.make_rows(40))
    spec = parse_spec(rm.mode_spec("sync", cfg()))
    data = spec.data.model_copy(update={"path": path})
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    source, _ = PromptSource.from_spec(data, seed=1, tokenizer=tokenizer, require_label=True)
    samples = [s for p in source.next_batch(40) for s in p.to_samples(1)]
    assert sum(bool(s.metadata.get("long")) for s in samples) == 2  # the flag reaches the samples
    assert rm.data_rows_needed(cfg()) == 1024 and rm.data_rows_needed(cfg(batch=100)) == 2 * 9 * 150


# ---------------------------------------------------------------------------------- percentiles


def test_percentiles_interpolate_like_numpy() -> None:
    values = list(range(1, 101))
    assert rm.percentile(values, 50) == 50.5
    assert rm.percentile(values, 90) == pytest.approx(90.1)
    assert rm.percentile(values, 99) == pytest.approx(99.01)
    assert rm.percentile([7], 95) == 7 and rm.percentile([], 50) is None
    assert rm.percentile([3, 1, 2], 100) == 3


def test_length_stats_show_the_tail_and_the_long_prompts_ratio() -> None:
    records = [{"length": 10, "long": False}] * 95 + [{"length": 80, "long": True, "truncated": True}] * 5
    s = rm.length_stats(records)
    assert s["count"] == 100 and s["p50"] == 10 and s["p90"] == 10 and s["max"] == 80
    assert s["p95"] == pytest.approx(10 + 70 * 0.05, abs=0.1) and s["p99"] == 80
    assert s["short_median"] == 10 and s["long_median"] == 80 and s["long_over_short_median"] == 8.0
    assert s["truncated_frac"] == 0.05 and s["mean"] == 13.5
    assert rm.length_stats([]) == {"count": 0}


# ------------------------------------------------------------------------------------------- GPUs


def gpu_record(
    processes: dict[str, list[str]] | None = None, t0: float = 0.0, dt: float = 1.0
) -> dict[str, Any]:
    # GPU 3: busy 80% with one idle sample in four; GPU 5: idle half the time; memory 60 vs 4 GB
    samples = [[t0 + t * dt, [0 if t % 4 == 0 else 80, 0 if t % 2 else 50], [60.0, 4.0]] for t in range(100)]
    samples.append([t0 + 500.0, [0, 0], [70.0, 70.0]])  # after the window: ignored
    return {
        "source": "nvml",
        "interval_s": 0.1,
        "indices": [3, 5],
        "samples": samples,
        "processes": processes or {},
    }


def test_idle_fraction_and_mean_utilization_over_the_steps_window() -> None:
    stats = rm.gpu_stats(gpu_record(), 0, 99)
    assert stats is not None
    g3, g5 = stats["gpus"]
    assert (
        g3["index"] == 3 and g3["samples"] == 100 and g3["idle_fraction"] == 0.25 and g3["mean_util"] == 60.0
    )
    assert g5["idle_fraction"] == 0.5 and g5["mean_util"] == 25.0 and g5["max_memory_gb"] == 4.0
    assert stats["engine_gpu"] == 3 and stats["trainer_gpu"] == 5 and stats["roles_by"].startswith("memory (")
    assert rm.gpu_stats(gpu_record(), 10, 19)["gpus"][0]["samples"] == 10
    assert rm.gpu_stats(None, 0, 1) is None
    assert rm.role_stat(stats, "trainer", "idle_fraction") == 0.5
    assert rm.role_stat(stats, "engine", "mean_util") == 60.0


def test_roles_come_from_memory_and_the_processes_confirm_them() -> None:
    agree = {
        "3": ["sglang::scheduler < python -m sglang.launch_server --model-path /m"],
        "5": ["ray::TorchRank.train < raylet"],
    }
    stats = rm.gpu_stats(gpu_record(agree), 0, 99)
    assert (stats["engine_gpu"], stats["trainer_gpu"], stats["roles_by"]) == (3, 5, "memory and processes")
    disagree = {"3": agree["5"], "5": agree["3"]}
    stats = rm.gpu_stats(gpu_record(disagree), 0, 99)
    assert (stats["engine_gpu"], stats["trainer_gpu"]) == (3, 5)
    assert stats["roles_by"] == "memory (the processes said engine 5, trainer 3)"
    both = {"3": ["sglang::scheduler"], "5": ["sglang::scheduler"]}  # no verdict from the processes
    assert rm.gpu_stats(gpu_record(both), 0, 99)["roles_by"] == "memory (the processes did not tell)"
    no_memory = [{"index": 0, "processes": agree["5"]}, {"index": 1, "processes": agree["3"]}]
    assert rm.assign_roles(no_memory) == {"engine_gpu": 1, "trainer_gpu": 0, "roles_by": "processes"}
    assert rm.assign_roles([{"index": 0}, {"index": 1}])["engine_gpu"] is None
    one = {"indices": [0], "samples": [[0, [10], [1.0]]], "source": "nvml"}
    assert rm.gpu_stats(one, 0, 1)["engine_gpu"] is None


def test_the_sampler_reads_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert bench.visible_indices(4) == [1, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert bench.visible_indices(2) == [0, 1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bench.visible_indices(2) == [0, 1]
    assert "pytest" in bench.process_description(os.getpid())  # this process, from /proc
    assert bench.process_description(2**30) == f"pid {2**30}"


class FakeNvml:
    """pynvml's calls the sampler makes: two GPUs, this process on GPU 1."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.ns = SimpleNamespace

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return self.ns(gpu=90 if h else 0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return self.ns(used=(50 if h else 3) * 10**9)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [self.ns(pid=os.getpid())] if h else []


def test_the_nvml_sampler_samples_every_gpu_and_sees_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = bench.GpuSampler(0.01).start()
    time.sleep(0.3)
    record = sampler.stop()
    assert record is not None and record["source"] == "nvml" and record["indices"] == [0, 1]
    assert len(record["samples"]) >= 5 and record["samples"][0][1:] == [[0, 90], [3.0, 50.0]]
    assert list(record["processes"]) == ["1"] and "python" in record["processes"]["1"][0]
    stats = rm.gpu_stats(record, 0, float("inf"))
    assert stats["engine_gpu"] == 1 and stats["trainer_gpu"] == 0
    assert stats["gpus"][0]["idle_fraction"] == 1.0 and stats["gpus"][1]["idle_fraction"] == 0.0


def test_without_pynvml_the_sampler_reads_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import time

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        '  *index,uuid*) printf "0, GPU-a\\n1, GPU-b\\n";;\n'
        '  *index,memory.used*) printf "0, 512\\n1, 2048\\n";;\n'
        f'  *compute-apps*) printf "GPU-b, {os.getpid()}\\n";;\n'
        '  *-lms*) while true; do printf "0, 0, 3000\\n1, 75, 51200\\n"; sleep 0.02; done;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = bench.GpuSampler(0.05).start()
    time.sleep(1.5)
    record = sampler.stop()
    assert record is not None and record["source"] == "nvidia-smi" and record["indices"] == [0, 1]
    assert len(record["samples"]) >= 5 and record["samples"][0][1:] == [[0, 75], [3000 / 1024, 50.0]]
    assert "python" in record["processes"]["1"][0]
    assert rm.gpu_stats(record, 0, float("inf"))["engine_gpu"] == 1  # by memory: this process is no engine
    assert bench.gpu_memory_used_gb() == [0.5, 2.0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert bench.gpu_memory_used_gb() == [2.0]


# ------------------------------------------------------------------------------------- summaries


def steps_of(
    step_s: float, rewards: list[float], *, start: float = 100.0, extra: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    out, t = [], start
    for i, r in enumerate(rewards):
        t += step_s
        out.append(
            {"t_end": t, "metrics": {"step": i + 1.0, "time/step": step_s, "reward/mean": r, **(extra or {})}}
        )
    return out


def summaries() -> list[dict[str, Any]]:
    rewards = [0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.8, 0.9]
    lengths = [{"t": 101.0, "length": 8, "long": False}] * 19 + [{"t": 101.0, "length": 64, "long": True}]
    sync = rm.summarize(
        "sync",
        steps_of(4.0, rewards),
        batch=32,
        n=4,
        lengths=lengths,
        gpu=gpu_record(t0=100.0, dt=0.32),
        startup_s=61.2,
    )
    fast = rm.summarize("one-step-off", steps_of(2.5, [r - 0.05 for r in rewards]), batch=32, n=4)
    worse = rm.summarize("buffer2", steps_of(3.0, [0.2] * 8), batch=32, n=4)
    partial = rm.summarize(
        "partial",
        steps_of(3.5, rewards[:7], extra={"dynamic_sampling/groups_trained": 32.0}),
        batch=32,
        n=4,
    )
    failed = rm.summarize("partial-async", [], batch=32, n=4, error="Traceback ...\nRuntimeError: boom")
    return [sync, fast, worse, partial, failed]


def test_summaries_count_samples_over_the_steps_wall_time() -> None:
    sync, fast, _, partial, failed = summaries()
    assert sync["steps"] == 8 and sync["samples"] == 8 * 128 and sync["wall_s"] == 32.0
    assert sync["samples_per_s"] == 32.0 and sync["steady_samples_per_s"] == 32.0
    assert sync["step_time_median_s"] == 4.0 and sync["startup_s"] == 61.2
    assert sync["reward_first2"] == 0.25 and sync["reward_last3"] == pytest.approx(0.8333, abs=1e-4)
    assert sync["lengths"]["count"] == 20 and sync["lengths"]["max"] == 64
    assert sync["gpu"]["engine_gpu"] == 3 and sync["gpu"]["gpus"][0]["samples"] == 100  # not the one at 600
    assert fast["samples_per_s"] == pytest.approx(51.2)
    assert partial["samples"] == 7 * 128 and partial["samples_per_step"] == [128] * 7
    assert partial["history"][0]["dynamic_sampling/groups_trained"] == 32.0 and len(partial["history"]) == 7
    assert failed["steps"] == 0 and failed["error"].endswith("boom")
    skipped = {"step": 1.0, "train/skipped_rollout": 1.0}
    assert rm.trained_samples(skipped, 32, 4) == 0
    assert rm.trained_samples({"dynamic_sampling/groups_trained": 24.0}, 32, 4) == 96


def test_the_table_learning_and_target_lines() -> None:
    rows = summaries()
    table = rm.format_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("| mode | steps | samples | wall s | samples/s | vs sync")
    assert len(lines) == 2 + 5 and all(line.count("|") == lines[0].count("|") for line in lines[:6])
    assert "| one-step-off | 8 | 1024 | 20.0 | 51.2 | 1.60 |" in table
    assert (
        "| sync | 8 | 1024 | 32.0 | 32.0 | 1.00 | 32.0 | 1.00 | 4.00 | 0.50/0.25 | 25/60 | 0.250 | 0.833 | 8/11/64 |"
        in table
    )
    assert lines[-1] == "| partial-async | 0 | | | | | | | | | | | | FAILED: RuntimeError: boom |"
    learning = rm.learning_lines(rows)
    assert learning[0] == "learning sync: rewards 0.20 0.30 0.50 0.60 0.70 0.80 0.80 0.90 | the reference"
    assert "no worse than sync" in learning[1] and "same steps and samples" in learning[1]
    assert "WORSE than sync" in learning[2]
    assert "steps/samples 7/896 vs sync's 8/1024" in learning[3]
    assert len(learning) == 4  # the failed mode has no curve
    assert rm.target_line(rows) == (
        "target best async / sync samples/s >= 1.3: met (one-step-off 1.60x, steady (from step 2) 1.60x)"
    )
    assert "missed (buffer2 1.33x" in rm.target_line([rows[0], rows[2]], target=1.5)
    assert "not measured" in rm.target_line(rows[1:])
    lengths = rm.length_lines(rows)
    assert lengths == [
        "lengths sync: 20 responses, p50 8 p90 8 p95 11 p99 53 max 64; short prompts' median 8 (19), long "
        "prompts' median 64 (1), ratio 8.0x; truncated 0.000"
    ]
    assert rm.gpu_lines(rows)[0].startswith("gpus sync (nvml, roles by memory")


def test_step_lines_keep_the_times_staleness_and_partial_metrics() -> None:
    metrics = {
        "step": 3.0,
        "reward/mean": 0.51234,
        "time/step": 2.0,
        "time/generate": 1.0,
        "time/train": 0.5,
        "time/sync": 0.25,
        "time/sync_load": 0.2,
        "rollout/staleness_mean": 1.0,
        "rollout/token_staleness_mean": 0.5,
        "partial/groups_carried": 16.0,
        "dynamic_sampling/groups_trained": 32.0,
        "train/pg_loss": 0.1,
    }
    line = rm.step_line("partial", metrics, 32, 4)
    assert line == {
        "mode": "partial",
        "step": 3,
        "samples": 128,
        "reward/mean": 0.5123,
        "time/step": 2.0,
        "time/generate": 1.0,
        "time/train": 0.5,
        "time/sync": 0.25,
        "rollout/staleness_mean": 1.0,
        "rollout/token_staleness_mean": 0.5,
        "partial/groups_carried": 16.0,
        "dynamic_sampling/groups_trained": 32.0,
    }
    json.dumps(line)


def test_documents_merge_in_mode_order_and_the_runner_reports_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = summaries()
    conf = rm.config_dict(cfg())
    first = rm.document(rows[2:4], config=conf | {"modes": ["buffer2", "partial"]})
    second = rm.document(rows[:2], config=conf | {"modes": ["sync", "one-step-off"]})
    merged = rm.merge([first, second])
    assert list(merged["modes"]) == ["sync", "one-step-off", "buffer2", "partial"]
    assert merged["modes"]["one-step-off"]["vs_sync"] == 1.6 and merged["config_differs"] == []
    assert merged["target"].startswith("target best async / sync samples/s >= 1.3: met")
    assert rm.merge([first, rm.document(rows[:1], config=conf | {"steps": 4})])["config_differs"] == ["steps"]
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "all.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    assert bench.main(["--merge", str(a), str(b), str(tmp_path / "missing.json"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| one-step-off | 8 | 1024 | 20.0 | 51.2 | 1.60 |" in printed and "not found" in printed
    assert json.loads(out.read_text())["modes"].keys() == merged["modes"].keys()
