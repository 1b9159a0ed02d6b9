"""Pure helpers of the rollout-modes benchmark (``rollout_modes.py``): the long-tail addition data,
each mode's job spec, the per-step lines, the summaries (samples/s, length percentiles, GPU idle
fractions and which GPU is whose), the table, the learning comparison, the target line and the JSON
document.

Nothing here starts a process or imports torch, Ray or SGLang.
"""

from __future__ import annotations

import copy
import json
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_env import KIT_SGLANG_ARGS

MODES = ("sync", "one-step-off", "buffer2", "partial", "partial-async")
ASYNC_MODES = ("one-step-off", "buffer2", "partial-async")  # the target's candidates
DESCRIPTIONS = {
    "sync": "rollout.async.enabled false",
    "one-step-off": "async, bufferSize 1",
    "buffer2": "async, bufferSize 2, updateWeightsInterval 2",
    "partial": "sync, dynamicSampling keep-all over-sampling x1.5, partialRollout",
    "partial-async": "partial + async, bufferSize 1",
}
FILTER_PATH = "keep_all_filter:keep"  # benchmarks/gpu/keep_all_filter.py
TARGET = 1.3  # best async mode's samples/s over sync's (the target)
REWARD_TOLERANCE = 0.1  # a mode's last-3 reward may be this much under sync's
IDLE_THRESHOLD = 5.0  # a GPU sample under this utilization (%) counts as idle
ENGINE_MARKERS = ("sglang", "hf_server")  # process names of an engine's GPU process

LONG_FRACTION = 0.05
SHORT_PROMPT = "What is {a} + {b}? Answer with just the number."  # the demo's (add-1digit.jsonl)
LONG_PROMPT = (
    "What is {a} + {b}? Before you answer, explain your reasoning step by step in great detail: say what "
    "each number means, count up from {a} one number at a time until you have added {b}, describe every "
    "single step in a full sentence, and then check the result again by counting in another way. Finish "
    "with the final answer as the last number you write."
)


# ---------------------------------------------------------------------------------------------- data


def make_rows(count: int, *, seed: int = 0, long_fraction: float = LONG_FRACTION) -> list[dict[str, Any]]:
    """``count`` single-digit additions (label: the sum, which the math reward finds as the response's
    last number). ``round(long_fraction * count)`` of them (at least one; seeded positions) ask for a
    long step-by-step explanation before the answer, the rest for the answer only (the demo's
    prompt). ``metadata.long`` tells them apart (it reaches each sample's metadata)."""
    if count < 1 or not 0 <= long_fraction < 0.5:
        raise ValueError(f"need count >= 1 and long_fraction in [0, 0.5), got {count}, {long_fraction}")
    rng = random.Random(f"rollout-modes/{seed}")
    n_long = max(1, round(count * long_fraction)) if long_fraction > 0 else 0
    long = set(rng.sample(range(count), n_long))
    rows = []
    for i in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        template = LONG_PROMPT if i in long else SHORT_PROMPT
        rows.append(
            {
                "prompt": template.format(a=a, b=b),
                "label": str(a + b),
                "metadata": {"id": i, "a": a, "b": b, "op": "+", "long": i in long},
            }
        )
    return rows


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def data_rows_needed(config: BenchConfig) -> int:
    """Prompts enough that no mode starts a second epoch: (steps + 1 made ahead) x the over-sampled
    batch, doubled; at least 1024."""
    return max(1024, 2 * (config.steps + 1) * over_sampling_batch(config))


# --------------------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class BenchConfig:
    """What every mode shares (the modes differ only in the fields ``mode_spec`` sets)."""

    model: str
    data: str
    workdir: str
    steps: int = 8
    batch: int = 32  # prompts per step (rollout.batchSize)
    n: int = 4  # samples per prompt
    max_response_len: int = 512
    device: str = "cuda"
    engine: str = "sglang"
    mem_fraction: float = 0.7  # the engine GPU's --mem-fraction-static
    global_batch: int | None = None  # default batch x n: one optimizer step per rollout (as the demo)
    micro_batch: int = 16
    lr: float = 3e-5  # the demo's
    temperature: float = 0.8  # the demo's
    seed: int = 1
    over_sampling: float = 1.5  # partial modes: overSamplingBatchSize = ceil(this x batch)
    sglang_args: Mapping[str, str] = field(default_factory=dict)  # more flags (override the kit's)

    @property
    def samples_per_step(self) -> int:
        return self.batch * self.n

    @property
    def global_batch_size(self) -> int:
        return self.global_batch or self.samples_per_step

    @property
    def micro_batch_size(self) -> int:
        """``micro_batch``, cut to a divisor of the global batch (a small CPU run)."""
        return math.gcd(self.micro_batch, self.global_batch_size)


def over_sampling_batch(config: BenchConfig) -> int:
    return math.ceil(config.over_sampling * config.batch)


def engine_args(config: BenchConfig) -> dict[str, str]:
    """rollout.sglangArgs: the kit's flags, the engine GPU's memory fraction, then ``sglang_args``."""
    if config.engine != "sglang":
        return {}
    return {**KIT_SGLANG_ARGS, "mem-fraction-static": str(config.mem_fraction), **config.sglang_args}


def base_spec(config: BenchConfig) -> dict[str, Any]:
    """The sync mode's spec: two devices (trainer 1, rollout 1, not colocated), torch backend, the
    demo's GRPO settings. numRollout is steps + 1: the runner stops after ``steps``
    (``RunOptions.stop_after``), so no final checkpoint is written inside the timed steps and an async
    producer keeps generating during the last step, as it would in a longer run."""
    cuda = config.device == "cuda"
    return {
        "model": {"path": config.model, "dtype": "bfloat16" if cuda else "float32"},
        "data": {"path": config.data, "applyChatTemplate": True},
        "algorithm": {"advantageEstimator": "grpo"},
        "rollout": {
            "engine": config.engine,
            "batchSize": config.batch,
            "nSamplesPerPrompt": config.n,
            "maxResponseLen": config.max_response_len,
            "temperature": config.temperature,
            "sglangArgs": engine_args(config),
            "async": {"enabled": False},
        },
        "training": {
            "backend": "torch",
            "numRollout": config.steps + 1,
            "globalBatchSize": config.global_batch_size,
            "microBatchSize": config.micro_batch_size,
            "seed": config.seed,
            "optimizer": {"lr": config.lr},
        },
        "resources": {
            "device": config.device,
            "colocate": False,
            "trainer": {"nodes": 1, "gpusPerNode": 1},
            "rollout": {"gpus": 1, "gpusPerNode": 1, "gpusPerEngine": 1},
        },
        "reward": {"type": "math"},
        "checkpoint": {"path": str(Path(config.workdir) / "ckpt"), "saveInterval": 0, "resume": "never"},
        "faultTolerance": {
            "engineHealthCheck": {"firstWaitSeconds": 0, "intervalSeconds": 10, "timeoutSeconds": 60},
            "maxEngineRestarts": 3,
        },
    }


def mode_spec(mode: str, config: BenchConfig) -> dict[str, Any]:
    """``mode``'s spec: the sync spec with the mode's fields (and its own checkpoint directory)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    spec = copy.deepcopy(base_spec(config))
    spec["checkpoint"]["path"] = str(Path(config.workdir) / f"ckpt-{mode}")
    rollout = spec["rollout"]
    if mode in ("one-step-off", "partial-async"):
        rollout["async"] = {"enabled": True, "bufferSize": 1, "updateWeightsInterval": 1}
    elif mode == "buffer2":
        rollout["async"] = {"enabled": True, "bufferSize": 2, "updateWeightsInterval": 2}
    if mode in ("partial", "partial-async"):
        spec["algorithm"]["dynamicSampling"] = {
            "enabled": True,
            "overSamplingBatchSize": over_sampling_batch(config),
        }
        rollout["customFilter"] = FILTER_PATH
        rollout["partialRollout"] = True
    return spec


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (to compare specs field by field)."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def spec_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Field path -> (a's value, b's value) where two specs differ (a missing field: None)."""
    fa, fb = flatten(a), flatten(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


# ----------------------------------------------------------------------------------------- per step

STEP_KEYS = (
    "reward/mean",
    "response_length/mean",
    "time/step",
    "time/generate",
    "time/train",
    "time/sync",
    "time/wait_generation",
    "dynamic_sampling/groups_seen",
    "dynamic_sampling/groups_kept",
    "dynamic_sampling/groups_trained",
    "dynamic_sampling/groups_abandoned",
)
STEP_PREFIXES = ("rollout/staleness", "rollout/token_staleness", "rollout/mixed_version", "partial/")


def trained_samples(metrics: Mapping[str, float], batch: int, n: int) -> int:
    """Samples a step trained on: none when it skipped training, dynamic sampling's trained groups x n,
    else the whole rollout (batch x n: plain generation returns every sample)."""
    if metrics.get("train/skipped_rollout"):
        return 0
    if "dynamic_sampling/groups_trained" in metrics:
        return int(metrics["dynamic_sampling/groups_trained"]) * n
    return batch * n


def step_line(mode: str, metrics: Mapping[str, float], batch: int, n: int) -> dict[str, Any]:
    """One step's JSON line: the step, reward, times, staleness and partial-rollout metrics."""
    line: dict[str, Any] = {"mode": mode, "step": int(metrics.get("step", 0))}
    line["samples"] = trained_samples(metrics, batch, n)
    for key, value in metrics.items():
        if key in STEP_KEYS or key.startswith(STEP_PREFIXES):
            line[key] = round(float(value), 4)
    return line


# ------------------------------------------------------------------------------------------ lengths


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def length_stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Response lengths (tokens) of the scored samples: count, mean, p50/p90/p95/p99/max, the short and
    the long prompts' medians (and their ratio), the truncated fraction. A record: ``length``,
    ``long`` (the prompt asked for an explanation), ``truncated``."""
    lengths = [float(r["length"]) for r in records]
    if not lengths:
        return {"count": 0}
    short = [float(r["length"]) for r in records if not r.get("long")]
    long = [float(r["length"]) for r in records if r.get("long")]
    out: dict[str, Any] = {"count": len(lengths), "mean": round(statistics.fmean(lengths), 1)}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = round(percentile(lengths, q) or 0.0, 1)
    out["max"] = max(lengths)
    out["short_count"], out["long_count"] = len(short), len(long)
    out["short_median"] = statistics.median(short) if short else None
    out["long_median"] = statistics.median(long) if long else None
    if short and long and out["short_median"]:
        out["long_over_short_median"] = round(out["long_median"] / out["short_median"], 1)
    out["truncated_frac"] = round(sum(bool(r.get("truncated")) for r in records) / len(records), 4)
    return out


# --------------------------------------------------------------------------------------------- GPUs


def gpu_stats(
    gpu: Mapping[str, Any] | None, start: float, end: float, threshold: float = IDLE_THRESHOLD
) -> dict[str, Any] | None:
    """Per GPU over the samples taken in [start, end]: the fraction with utilization under
    ``threshold`` %, the mean utilization, the most memory used; then which GPU is the trainer's and
    which the engine's (``assign_roles``). ``gpu``: the sampler's record, ``{"source", "interval_s",
    "indices": [physical index, ...], "samples": [[t, [util %, ...], [memory GB, ...]], ...],
    "processes": {index: [process name, ...]}}``."""
    if not gpu or not gpu.get("indices"):
        return None
    window = [s for s in gpu.get("samples", []) if start <= s[0] <= end]
    per_gpu = []
    for pos, index in enumerate(gpu["indices"]):
        utils = [float(s[1][pos]) for s in window]
        mems = [float(s[2][pos]) for s in window if len(s) > 2]
        per_gpu.append(
            {
                "index": index,
                "samples": len(utils),
                "idle_fraction": round(sum(u < threshold for u in utils) / len(utils), 4) if utils else None,
                "mean_util": round(statistics.fmean(utils), 1) if utils else None,
                "max_memory_gb": round(max(mems), 2) if mems else None,
                "processes": sorted(set((gpu.get("processes") or {}).get(str(index), []))),
            }
        )
    roles = assign_roles(per_gpu)
    return {
        "source": gpu.get("source"),
        "interval_s": gpu.get("interval_s"),
        "threshold_pct": threshold,
        "gpus": per_gpu,
        **roles,
    }


def assign_roles(per_gpu: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which GPU is the engine's and which the trainer's. By memory: the engine reserves
    mem-fraction-static of its GPU (70%), far more than a 135M trainer holds, so the GPU using the most
    is the engine's and the next the trainer's. The processes seen on each GPU (one GPU holding an
    SGLang / hf-server process, the other GPU a process of its own) confirm it, or, where the memory
    does not tell (no memory figures), decide."""
    if len(per_gpu) < 2:
        return {"engine_gpu": None, "trainer_gpu": None, "roles_by": f"{len(per_gpu)} GPU(s): no roles"}

    def is_engine(g: Mapping[str, Any]) -> bool:
        return any(m in name for name in g.get("processes", []) for m in ENGINE_MARKERS)

    by_processes = None
    engines = [g for g in per_gpu if is_engine(g)]
    if len(engines) == 1:
        others = [g for g in per_gpu if g is not engines[0] and g.get("processes")]
        if len(others) == 1:
            by_processes = (engines[0]["index"], others[0]["index"])
    if not any(g.get("max_memory_gb") for g in per_gpu):
        if by_processes is None:
            return {"engine_gpu": None, "trainer_gpu": None, "roles_by": "unknown (no memory, no processes)"}
        return {"engine_gpu": by_processes[0], "trainer_gpu": by_processes[1], "roles_by": "processes"}
    by_memory = sorted(per_gpu, key=lambda g: -(g.get("max_memory_gb") or 0.0))
    roles = (by_memory[0]["index"], by_memory[1]["index"])
    if by_processes is None:
        how = "memory (the processes did not tell)"
    elif by_processes == roles:
        how = "memory and processes"
    else:
        how = f"memory (the processes said engine {by_processes[0]}, trainer {by_processes[1]})"
    return {"engine_gpu": roles[0], "trainer_gpu": roles[1], "roles_by": how}


def role_stat(gpu: Mapping[str, Any] | None, role: str, key: str) -> float | None:
    """``key`` of the GPU in ``role`` (trainer, engine)."""
    if not gpu or gpu.get(f"{role}_gpu") is None:
        return None
    for g in gpu["gpus"]:
        if g["index"] == gpu[f"{role}_gpu"]:
            return g.get(key)
    return None


# ---------------------------------------------------------------------------------------- summaries


def summarize(
    mode: str,
    steps: Sequence[Mapping[str, Any]],
    *,
    batch: int,
    n: int,
    lengths: Sequence[Mapping[str, Any]] = (),
    gpu: Mapping[str, Any] | None = None,
    error: str | None = None,
    startup_s: float | None = None,
) -> dict[str, Any]:
    """One mode's figures. ``steps``: ``{"t_end": monotonic s when the step ended, "metrics": {...}}``
    in order. The steps' wall time runs from the first step's start (its end minus its time/step) to
    the last step's end (startup excluded); samples/s = trained samples / that. "steady" leaves the
    first step out (no overlap yet in async modes, the weight-update group's set-up)."""
    out: dict[str, Any] = {"mode": mode, "description": DESCRIPTIONS.get(mode, ""), "error": error}
    out["startup_s"] = round(startup_s, 1) if startup_s is not None else None
    if not steps:
        return out | {"steps": 0, "samples": 0}
    metrics = [s["metrics"] for s in steps]
    per_step = [trained_samples(m, batch, n) for m in metrics]
    start = steps[0]["t_end"] - float(metrics[0].get("time/step", 0.0))
    end = steps[-1]["t_end"]
    wall = max(end - start, 1e-9)
    steady_wall = end - steps[0]["t_end"]
    rewards = [float(m.get("reward/mean", float("nan"))) for m in metrics]
    step_times = [float(m.get("time/step", float("nan"))) for m in metrics]
    out |= {
        "steps": len(steps),
        "samples": sum(per_step),
        "samples_per_step": per_step,
        "wall_s": round(wall, 2),
        "samples_per_s": round(sum(per_step) / wall, 2),
        "steady_samples_per_s": round(sum(per_step[1:]) / steady_wall, 2)
        if len(steps) > 1 and steady_wall > 0
        else None,
        "step_time_median_s": round(statistics.median(step_times), 3),
        "step_times_s": [round(t, 3) for t in step_times],
        "rewards": [round(r, 4) for r in rewards],
        "reward_first2": _mean(rewards[:2]),
        "reward_last3": _mean(rewards[-3:]),
        "time_means_s": {
            k: _mean([float(m[k]) for m in metrics if k in m])
            for k in ("time/generate", "time/train", "time/sync", "time/wait_generation")
            if any(k in m for m in metrics)
        },
        "lengths": length_stats([r for r in lengths if r.get("t", start) <= end]),
        "gpu": gpu_stats(gpu, start, end),
        "window": [start, end],
        "history": [dict(m) for m in metrics],  # every metric of every step, as the driver reported it
    }
    return out


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def with_ratios(summaries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each summary with ``vs_sync`` (samples/s over sync's) and ``steady_vs_sync``."""
    rows = [dict(s) for s in summaries]
    sync = next((r for r in rows if r["mode"] == "sync" and r.get("samples_per_s")), None)
    for r in rows:
        for key, ratio in (("samples_per_s", "vs_sync"), ("steady_samples_per_s", "steady_vs_sync")):
            base = sync.get(key) if sync else None
            r[ratio] = round(r[key] / base, 3) if base and r.get(key) else None
    return rows


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def format_table(summaries: Iterable[Mapping[str, Any]]) -> str:
    rows = with_ratios(summaries)
    head = (
        "| mode | steps | samples | wall s | samples/s | vs sync | steady samples/s | vs sync | step median s "
        "| idle trainer/engine | util % trainer/engine | reward first2 | reward last3 | len p50/p95/max |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        if not r.get("steps"):
            last = (r.get("error") or "").strip().splitlines()[-1:] or [""]
            lines.append(f"| {r['mode']} | 0 | | | | | | | | | | | | FAILED: {last[0][:80]} |")
            continue
        gpu, lengths = r.get("gpu"), r.get("lengths") or {}
        idle = f"{_f(role_stat(gpu, 'trainer', 'idle_fraction'))}/{_f(role_stat(gpu, 'engine', 'idle_fraction'))}"
        util = f"{_f(role_stat(gpu, 'trainer', 'mean_util'), '{:.0f}')}/{_f(role_stat(gpu, 'engine', 'mean_util'), '{:.0f}')}"
        lens = f"{_f(lengths.get('p50'), '{:.0f}')}/{_f(lengths.get('p95'), '{:.0f}')}/{_f(lengths.get('max'), '{:.0f}')}"
        lines.append(
            f"| {r['mode']}{' (FAILED)' if r.get('error') else ''} | {r['steps']} | {r['samples']} | {r['wall_s']:.1f} "
            f"| {r['samples_per_s']:.1f} | {_f(r.get('vs_sync'))} | {_f(r.get('steady_samples_per_s'), '{:.1f}')} "
            f"| {_f(r.get('steady_vs_sync'))} | {r['step_time_median_s']:.2f} | {idle} | {util} "
            f"| {_f(r.get('reward_first2'), '{:.3f}')} | {_f(r.get('reward_last3'), '{:.3f}')} | {lens} |"
        )
    return "\n".join(lines)


def length_lines(summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Per mode: the length percentiles and the long prompts' median over the short ones'."""
    out = []
    for r in summaries:
        s = r.get("lengths") or {}
        if not s.get("count"):
            continue
        out.append(
            f"lengths {r['mode']}: {s['count']} responses, p50 {s['p50']:.0f} p90 {s['p90']:.0f} p95 {s['p95']:.0f} "
            f"p99 {s['p99']:.0f} max {s['max']:.0f}; short prompts' median {_f(s.get('short_median'), '{:.0f}')} "
            f"({s['short_count']}), long prompts' median {_f(s.get('long_median'), '{:.0f}')} ({s['long_count']}), "
            f"ratio {_f(s.get('long_over_short_median'), '{:.1f}')}x; truncated {s['truncated_frac']:.3f}"
        )
    return out


def gpu_lines(summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for r in summaries:
        gpu = r.get("gpu")
        if not gpu:
            continue
        parts = [
            f"GPU {g['index']} ({'engine' if g['index'] == gpu.get('engine_gpu') else 'trainer' if g['index'] == gpu.get('trainer_gpu') else '?'}): "
            f"idle {_f(g['idle_fraction'])} mean {_f(g['mean_util'], '{:.0f}')}% max {_f(g['max_memory_gb'], '{:.1f}')} GB "
            f"{g['samples']} samples [{', '.join(g['processes'][:3])}]"
            for g in gpu["gpus"]
        ]
        out.append(f"gpus {r['mode']} ({gpu['source']}, roles by {gpu['roles_by']}): " + "; ".join(parts))
    return out


def learning_lines(summaries: Iterable[Mapping[str, Any]], tolerance: float = REWARD_TOLERANCE) -> list[str]:
    """Each mode's reward curve; whether it trained the same steps and samples as sync and is no worse
    (last-3 mean reward at least sync's minus ``tolerance``)."""
    rows = [r for r in summaries if r.get("steps")]
    sync = next((r for r in rows if r["mode"] == "sync"), None)
    out = []
    for r in rows:
        curve = " ".join(f"{x:.2f}" for x in r["rewards"])
        if sync is None:
            verdict = "no sync run to compare with"
        elif r["mode"] == "sync":
            verdict = "the reference"
        else:
            same = r["steps"] == sync["steps"] and r["samples"] == sync["samples"]
            ok = r["reward_last3"] >= sync["reward_last3"] - tolerance
            verdict = (
                f"{'no worse than' if ok else 'WORSE than'} sync (last-3 {r['reward_last3']:.3f} vs "
                f"{sync['reward_last3']:.3f}, tolerance {tolerance}); "
                + (
                    "same steps and samples"
                    if same
                    else f"steps/samples {r['steps']}/{r['samples']} vs sync's {sync['steps']}/{sync['samples']}"
                )
            )
        out.append(f"learning {r['mode']}: rewards {curve} | {verdict}")
    return out


def target_line(summaries: Iterable[Mapping[str, Any]], target: float = TARGET) -> str:
    """The issue's target: the best async mode's samples/s at least ``target`` x sync's."""
    rows = [
        r
        for r in with_ratios(summaries)
        if r["mode"] in ASYNC_MODES and r.get("vs_sync") and not r.get("error")
    ]
    if not rows:
        return f"target best async / sync samples/s >= {target}: not measured (needs sync and an async mode)"
    best = max(rows, key=lambda r: r["vs_sync"])
    verdict = "met" if best["vs_sync"] >= target else "missed"
    steady = f", steady (from step 2) {best['steady_vs_sync']:.2f}x" if best.get("steady_vs_sync") else ""
    return f"target best async / sync samples/s >= {target}: {verdict} ({best['mode']} {best['vs_sync']:.2f}x{steady})"


# ------------------------------------------------------------------------------------------- JSON


def document(
    summaries: Sequence[Mapping[str, Any]],
    *,
    config: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    rows = with_ratios(summaries)
    return {
        "benchmark": "rollout_modes",
        "config": dict(config),
        "modes": {r["mode"]: r for r in rows},
        "learning": learning_lines(rows),
        "target": target_line(rows),
        **dict(extra or {}),
    }


def merge(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Documents of runs of different modes (one per mode, or per call) as one: the modes in MODES'
    order (a later document's run of a mode replaces an earlier one), the first document's config,
    and the configs that differ (other than the modes run) listed."""
    if not documents:
        raise ValueError("nothing to merge")
    modes: dict[str, Mapping[str, Any]] = {}
    for doc in documents:
        modes.update(doc.get("modes", {}))
    ordered = [modes[m] for m in MODES if m in modes] + [v for k, v in modes.items() if k not in MODES]
    config = dict(documents[0].get("config", {}))
    differ = sorted(
        {
            k
            for doc in documents[1:]
            for k, v in doc.get("config", {}).items()
            if k not in ("modes", "out", "workdir", "data") and config.get(k) != v
        }
    )
    return document(ordered, config=config, extra={"merged": len(documents), "config_differs": differ})


def config_dict(config: BenchConfig) -> dict[str, Any]:
    out = asdict(config)
    out["sglang_args"] = dict(config.sglang_args)
    out["global_batch_size"] = config.global_batch_size
    out["micro_batch_size"] = config.micro_batch_size
    return out
