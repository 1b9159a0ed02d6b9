"""Weight sync into SGLang through the runtime's own path, end to end: a real trainer group (Ray
actors; megatron by default, so the Megatron -> HF name conversion is in the time) pushes its
weights into a real engine behind the manager's update frame (pause, flush, transfer, version,
continue), with the transport a run would use:

- ``--transport ipc``: colocated on one GPU, CUDA IPC buckets (at most two alive, ``--bucket-mb``);
- ``--transport nccl``: trainer on GPU 0, engine on GPU 1, NCCL broadcast of flattened buckets.

Per model (random-weight Qwen3 shapes, ``model_dirs.py``): ``--reps`` pushes after one warm-up, the
median sync and its parts (export, share/load for IPC, pause+flush and finish), GB/s, and the floor
beside it: for IPC two device copies of the bytes (the trainer's flatten and the engine's load, each
timed as one large copy on this GPU); for NCCL one NVLink transfer (450 GB/s, NVLink 4). Prints a
table and the target lines (IPC >= 200 GB/s, NCCL >= 150 GB/s for the 4b), writes ``--json``.

    python3 benchmarks/gpu/sglang_weight_sync.py --transport ipc --models 0.5b 1.5b 4b --reps 5
    python3 benchmarks/gpu/sglang_weight_sync.py --transport nccl --models 4b      # two GPUs

``--cpu`` runs the same harness on CPU (hf engine, torch trainer, gloo instead of NCCL, a tiny
model): what the unit tests run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/bench_cli.py
from bench_cli import add_json, add_log_dir, add_mem_fraction, add_model_root, dir_or_temp, doc_parser
from bench_env import KIT_SGLANG_ARGS
from model_dirs import MODELS, ensure_model_dir

TARGET_GBPS = {"ipc": 200.0, "nccl": 150.0}
TARGET_MODEL = "4b"
NVLINK_GBPS = 450.0
PARTS = ("time/sync_export", "time/sync_share", "time/sync_load", "time/sync_pause_flush", "time/sync_finish")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser(__doc__)
    p.add_argument("--transport", choices=("ipc", "nccl"), default="ipc")
    p.add_argument("--models", nargs="+", default=["0.5b", "1.5b", "4b"], choices=sorted(MODELS))
    p.add_argument("--reps", type=int, default=5, help="timed pushes after one warm-up (default 5)")
    p.add_argument("--bucket-mb", type=int, default=None, help="bucket size (default: the runtime's)")
    p.add_argument("--backend", choices=("megatron", "torch"), default="megatron")
    add_mem_fraction(p, 0.3, help="the engine's mem-fraction-static")
    add_model_root(p, help="reuse model directories here")
    add_log_dir(p)
    add_json(p)
    p.add_argument("--cpu", action="store_true", help="the harness on CPU: hf engine, torch, gloo")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if args.bucket_mb is not None and args.bucket_mb <= 0:
        p.error("--bucket-mb must be positive")
    if args.cpu:
        args.backend, args.models = "torch", [m for m in args.models if m == "tiny"] or ["tiny"]
    return args


def job_spec(args: argparse.Namespace, model_dir: Path) -> Any:
    from rljob_runtime.config import config_from_document

    colocate = args.transport == "ipc"
    resources: dict[str, Any] = {
        "device": "cpu" if args.cpu else "cuda",
        "colocate": colocate,
        "trainer": {"nodes": 1, "gpusPerNode": 1},
    }
    if not colocate:
        resources["rollout"] = {"gpus": 1, "gpusPerNode": 1}
    sglang_args = {} if args.cpu else {**KIT_SGLANG_ARGS, "mem-fraction-static": str(args.mem_fraction)}
    doc = {
        "model": {"path": str(model_dir), "dtype": "float32" if args.cpu else "bfloat16"},
        "data": {"path": "/unused.jsonl"},
        "rollout": {
            "engine": "hf" if args.cpu else "sglang",
            "batchSize": 1,
            "nSamplesPerPrompt": 1,
            "sglangArgs": sglang_args,
        },
        "training": {"backend": args.backend, "globalBatchSize": 1, "microBatchSize": 1},
        "resources": resources,
        "faultTolerance": {"engineHealthCheck": {"enabled": False}},
    }
    return config_from_document(doc).spec


def summarize(runs: list[dict[str, float]], floor_gbps: float) -> dict[str, Any]:
    """Median sync time and parts of the timed runs, GB/s against the floor."""
    seconds = statistics.median(r["time/sync"] for r in runs)
    size = runs[0]["sync/bytes"]
    parts = {
        k.removeprefix("time/sync_"): statistics.median(r.get(k, 0.0) for r in runs) * 1e3 for k in PARTS
    }
    return {
        "bytes": size,
        "buckets": runs[0].get("sync/buckets", 0.0),
        "sync_ms": seconds * 1e3,
        "sync_ms_all": [round(r["time/sync"] * 1e3, 2) for r in runs],
        "gb_per_s": size / seconds / 1e9,
        "floor_gb_per_s": floor_gbps,
        "parts_ms": {k: round(v, 2) for k, v in parts.items()},
    }


def format_table(transport: str, results: list[dict[str, Any]]) -> str:
    head = f"| model | GB | buckets | sync ms (median) | GB/s | floor GB/s | {' | '.join(p.removeprefix('time/sync_') for p in PARTS)} |"
    lines = [head, "|" + "---|" * (6 + len(PARTS))]
    for r in results:
        parts = " | ".join(f"{r['parts_ms'][p.removeprefix('time/sync_')]:.1f}" for p in PARTS)
        lines.append(
            f"| {r['model']} | {r['bytes'] / 1e9:.2f} | {r['buckets']:.0f} | {r['sync_ms']:.1f} | "
            f"{r['gb_per_s']:.0f} | {r['floor_gb_per_s']:.0f} | {parts} |"
        )
    return "\n".join(lines)


def target_line(transport: str, results: list[dict[str, Any]]) -> str:
    target = TARGET_GBPS[transport]
    mine = [r for r in results if r["model"] == TARGET_MODEL]
    if not mine:
        return f"target ({transport} >= {target:.0f} GB/s on the {TARGET_MODEL}): not measured in this run"
    got = mine[0]["gb_per_s"]
    return f"target ({transport} >= {target:.0f} GB/s on the {TARGET_MODEL}): {got:.0f} GB/s, {'met' if got >= target else 'missed'}"


def copy_floor_gbps(nbytes: int) -> float:
    """GB/s of the sync if only its two device copies of ``nbytes`` took time (IPC's floor)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / (2 * statistics.median(times)) / 1e9


def run_model(model: str, args: argparse.Namespace, root: Path, log_dir: Path) -> dict[str, Any]:
    import ray

    from rljob_runtime import placement as placement_mod
    from rljob_runtime.rollout.manager import RolloutManager
    from rljob_runtime.sync import make_transport
    from rljob_runtime.trainer import create_trainer

    model_dir = ensure_model_dir(root, model, device="cpu" if args.cpu else "cuda")
    spec = job_spec(args, model_dir)
    ray.init(
        num_cpus=4,
        resources=placement_mod.local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
    )
    trainer = rollout = None
    try:
        placement = placement_mod.create_placement(spec, timeout_s=120)
        trainer = create_trainer(spec, str(model_dir), placement.trainer)
        rollout = RolloutManager.create(
            spec, model_dir, placement, log_dir=log_dir / model, startup_timeout_s=900
        )
        bucket = args.bucket_mb << 20 if args.bucket_mb else None
        kind = "cuda_ipc" if args.transport == "ipc" else "nccl"
        transport = make_transport(
            spec,
            single_node=True,
            transport=kind,
            bucket_bytes=bucket,
            group_backend="gloo" if args.cpu else "nccl",
        )
        runs = []
        for rep in range(args.reps + 1):  # the first is a warm-up (NCCL connects, handles open)
            metrics = transport.push(trainer, rollout, rep + 1)
            print(
                f"{model} sync {rep}: " + json.dumps({k: round(v, 5) for k, v in sorted(metrics.items())}),
                flush=True,
            )
            if rep:
                runs.append(metrics)
        info = rollout.engine_info()
        transport.close()
        if args.cpu:
            floor = float("nan")
        elif args.transport == "ipc":
            floor = copy_floor_gbps(int(runs[0]["sync/bytes"]))
        else:
            floor = NVLINK_GBPS
        out = {"model": model, **summarize(runs, floor), "engine_launches": [e["launches"] for e in info]}
        out["weight_version_after"] = rollout.weight_version
        return out
    finally:
        if rollout is not None:
            rollout.shutdown()
        if trainer is not None:
            trainer.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = dir_or_temp(args.model_root, "rljob-sync-models-")
    log_dir = dir_or_temp(args.log_dir, "rljob-sync-logs-")
    results, failed = [], []
    for model in args.models:
        try:
            results.append(run_model(model, args, root, log_dir))
        except Exception as exc:  # one model failing must not lose the others' figures
            print(f"{model} FAILED: {type(exc).__name__}: {exc}", flush=True)
            failed.append(model)
    print(
        f"\nweight sync into {'hf (cpu)' if args.cpu else 'SGLang'} over {args.transport}, backend {args.backend}"
    )
    print(format_table(args.transport, results))
    if not args.cpu:
        print(target_line(args.transport, results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
