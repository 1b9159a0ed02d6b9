"""Rollout throughput of the runtime's whole path against stock SGLang alone, on one GPU, same model,
same load. How much of SGLang's generation speed does manager -> sglang-router -> engine keep?

Modes (each times the workload twice after a warm-up and keeps the better run; both are printed):
- ``stock``: ``python -m sglang.launch_server`` with the flags the runtime would pass (the same
  ``EngineProcess``), and a plain aiohttp client posting every request at once;
- ``runtime``: a local Ray, ``RolloutManager.create`` (one engine of ``rollout.engine: sglang`` behind
  the real sglang-router), ``manager.generate`` as the driver calls it;
- ``hf``: the same runtime path with ``rollout.engine: hf`` on the GPU (rljob's transformers engine).

Workloads (random prompt token ids, ``ignore_eos`` so every request makes exactly its length):
- ``fixed``: 256 prompts of 128 tokens -> 256 new tokens;
- ``longtail``: the same prompts, 95% asking 256 tokens and 5% eight times that (seeded).

Random-weight Qwen3 shapes (``model_dirs.py``) with SmolLM2's tokenizer. Prints a table and the target
line (runtime >= 95% of stock); ``--json`` keeps everything.

    python3 benchmarks/gpu/rollout_throughput.py --model 0.5b --modes stock runtime hf --json t.json
    python3 benchmarks/gpu/rollout_throughput.py --model tiny --device cpu --modes stock runtime \\
        --prompts 4 --prompt-len 8 --new-tokens 8        # the harness on CPU (hf as the "stock" server)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _path in (REPO / "runtime", REPO / "api", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from model_dirs import MODELS, ensure_model_dir  # noqa: E402

KIT_SGLANG_ARGS = {
    "attention-backend": "triton",
    "sampling-backend": "pytorch",
    "disable-flashinfer-autotune": "",
}
TARGET = 0.95
LONG_FRACTION, LONG_FACTOR = 0.05, 8


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]
    new_tokens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.new_tokens)


def make_workloads(
    names: list[str], prompts: int, prompt_len: int, new_tokens: int, vocab: int, seed: int = 0
) -> list[Workload]:
    """The same random prompts for every workload; ``longtail``: a seeded 5% ask 8x the tokens."""
    rng = random.Random(seed)
    low = min(100, vocab // 2)  # past the special tokens
    ids = [[rng.randrange(low, vocab) for _ in range(prompt_len)] for _ in range(prompts)]
    out = []
    for name in names:
        if name == "fixed":
            lengths = [new_tokens] * prompts
        elif name == "longtail":
            long = set(rng.sample(range(prompts), max(1, round(prompts * LONG_FRACTION))))
            lengths = [new_tokens * LONG_FACTOR if i in long else new_tokens for i in range(prompts)]
        else:
            raise ValueError(f"unknown workload {name!r}: fixed or longtail")
        out.append(Workload(name, ids, lengths))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="0.5b")
    p.add_argument(
        "--modes", nargs="+", choices=("stock", "runtime", "hf"), default=["stock", "runtime", "hf"]
    )
    p.add_argument("--workloads", nargs="+", choices=("fixed", "longtail"), default=["fixed", "longtail"])
    p.add_argument(
        "--hf-workloads",
        nargs="+",
        choices=("fixed", "longtail"),
        default=["fixed"],
        help="the hf engine is slow: its workloads (default fixed)",
    )
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--mem-fraction", type=float, default=0.8)
    p.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more SGLang flags for both stock and runtime (repeatable)",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--model-root", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if min(args.prompts, args.prompt_len, args.new_tokens) < 1:
        p.error("--prompts, --prompt-len and --new-tokens must be positive")
    return args


def sglang_args(args: argparse.Namespace) -> dict[str, str]:
    extra = dict(KIT_SGLANG_ARGS, **{"mem-fraction-static": str(args.mem_fraction)})
    for item in args.sglang_arg:
        key, _, value = item.partition("=")
        extra[key.strip().lstrip("-")] = value
    return extra


def job(args: argparse.Namespace, model_dir: Path, engine: str) -> Any:
    from rljob_runtime.config import config_from_document

    doc = {
        "model": {"path": str(model_dir), "dtype": "bfloat16" if args.device == "cuda" else "float32"},
        "data": {"path": "/unused.jsonl"},
        "rollout": {
            "engine": engine,
            "batchSize": 1,
            "nSamplesPerPrompt": 1,
            "temperature": 1.0,
            "sglangArgs": sglang_args(args) if engine == "sglang" else {},
        },
        "training": {"backend": "torch", "globalBatchSize": 1},
        "resources": {"device": args.device, "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": 1}},
        "faultTolerance": {"engineHealthCheck": {"enabled": False}},
    }
    return config_from_document(doc).spec


def summarize(mode: str, workload: Workload, seconds: list[float]) -> dict[str, Any]:
    best = min(seconds)
    return {
        "mode": mode,
        "workload": workload.name,
        "requests": len(workload.prompts),
        "output_tokens": workload.output_tokens,
        "seconds": [round(s, 3) for s in seconds],
        "tok_per_s": workload.output_tokens / best,
        "tok_per_s_median": workload.output_tokens / statistics.median(seconds),
    }


def format_table(model: str, rows: list[dict[str, Any]]) -> str:
    stock = {r["workload"]: r["tok_per_s"] for r in rows if r["mode"] == "stock"}
    lines = [
        "| model | mode | workload | requests | output tokens | seconds (runs) | tok/s (best) | vs stock |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["tok_per_s"] / stock[r["workload"]] if r["workload"] in stock else None
        lines.append(
            f"| {model} | {r['mode']} | {r['workload']} | {r['requests']} | {r['output_tokens']} | "
            f"{' / '.join(f'{s:.2f}' for s in r['seconds'])} | {r['tok_per_s']:,.0f} | "
            f"{'' if ratio is None else f'{ratio:.3f}'} |"
        )
    return "\n".join(lines)


def target_lines(rows: list[dict[str, Any]]) -> list[str]:
    stock = {r["workload"]: r["tok_per_s"] for r in rows if r["mode"] == "stock"}
    out = []
    for r in rows:
        if r["mode"] == "runtime" and r["workload"] in stock:
            ratio = r["tok_per_s"] / stock[r["workload"]]
            verdict = "met" if ratio >= TARGET else "missed"
            out.append(f"target (runtime >= {TARGET:.0%} of stock, {r['workload']}): {ratio:.3f}, {verdict}")
    return out


# ------------------------------------------------------------------------------------------ modes


async def _post_all(url: str, workload: Workload) -> int:
    import aiohttp

    async def one(session: aiohttp.ClientSession, ids: list[int], n: int) -> int:
        body = {
            "input_ids": ids,
            "sampling_params": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True,
        }
        async with session.post(f"{url}/generate", json=body) as resp:
            answer = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"/generate: HTTP {resp.status}: {str(answer)[:300]}")
        return len(answer["meta_info"]["output_token_logprobs"])

    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        made = await asyncio.gather(
            *(one(session, ids, n) for ids, n in zip(workload.prompts, workload.new_tokens, strict=True))
        )
    return sum(made)


def run_stock(
    args: argparse.Namespace, model_dir: Path, workloads: list[Workload], log_dir: Path
) -> list[dict[str, Any]]:
    """Stock SGLang (or, on CPU, our hf server standing in for it) and a plain client."""
    from rljob_runtime.rollout.engine_actor import EngineProcess

    engine = EngineProcess(
        kind="sglang" if args.device == "cuda" else "hf",
        model_path=str(model_dir),
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        enable_memory_saver=args.device == "cuda",  # as a colocated runtime engine runs
        sglang_args=sglang_args(args) if args.device == "cuda" else None,
        log_dir=str(log_dir / "stock"),
        startup_timeout_s=900,
    )
    rows = []
    try:
        url = engine.start()
        asyncio.run(
            _post_all(
                url, Workload("warmup", workloads[0].prompts[:8], [16] * min(8, len(workloads[0].prompts)))
            )
        )
        for workload in workloads:
            seconds = []
            for _ in range(2):
                started = time.perf_counter()
                made = asyncio.run(_post_all(url, workload))
                seconds.append(time.perf_counter() - started)
                if made != workload.output_tokens:
                    raise RuntimeError(
                        f"stock made {made} tokens, the workload asks {workload.output_tokens}"
                    )
            rows.append(summarize("stock", workload, seconds))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        engine.shutdown()
    return rows


def run_runtime(
    args: argparse.Namespace,
    model_dir: Path,
    workloads: list[Workload],
    engine: str,
    mode: str,
    log_dir: Path,
) -> list[dict[str, Any]]:
    """The driver's rollout path: RolloutManager -> sglang-router -> one engine."""
    import ray

    from rljob_runtime import placement as placement_mod
    from rljob_runtime.data.sample import Sample
    from rljob_runtime.rollout.manager import RolloutManager

    spec = job(args, model_dir, engine)
    ray.init(
        num_cpus=4,
        resources=placement_mod.local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
    )
    manager = None
    rows = []
    try:
        placement = placement_mod.create_placement(spec, timeout_s=120)
        manager = RolloutManager.create(
            spec, model_dir, placement, log_dir=log_dir / mode, startup_timeout_s=900
        )

        def generate(workload: Workload) -> int:
            by_length: dict[int, list[Sample]] = {}
            for i, (ids, n) in enumerate(zip(workload.prompts, workload.new_tokens, strict=True)):
                by_length.setdefault(n, []).append(Sample(index=i, prompt_ids=list(ids)))
            # one generate call per length, all in flight at once, as one rollout's requests are
            futures = [
                manager.generate_async(samples, max_new_tokens=n, ignore_eos=True, temperature=1.0)
                for n, samples in by_length.items()
            ]
            return sum(s.response_length for f in futures for s in f.result())

        generate(Workload("warmup", workloads[0].prompts[:8], [16] * min(8, len(workloads[0].prompts))))
        for workload in workloads:
            seconds = []
            for _ in range(2):
                started = time.perf_counter()
                made = generate(workload)
                seconds.append(time.perf_counter() - started)
                if made != workload.output_tokens:
                    raise RuntimeError(
                        f"{mode} made {made} tokens, the workload asks {workload.output_tokens}"
                    )
            rows.append(summarize(mode, workload, seconds))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if manager is not None:
            manager.shutdown()
        ray.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rljob_runtime.models import resolve_model

    root = args.model_root or Path(tempfile.mkdtemp(prefix="rljob-throughput-"))
    log_dir = Path(tempfile.mkdtemp(prefix="rljob-throughput-logs-"))
    tokenizer = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    model_dir = ensure_model_dir(root, args.model, tokenizer=tokenizer, device=args.device)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    workloads = make_workloads(args.workloads, args.prompts, args.prompt_len, args.new_tokens, vocab)
    rows: list[dict[str, Any]] = []
    failed = False
    for mode in args.modes:
        try:
            if mode == "stock":
                rows += run_stock(args, model_dir, workloads, log_dir)
            elif mode == "runtime":
                engine = "sglang" if args.device == "cuda" else "hf"  # on CPU the hf engine stands in
                rows += run_runtime(args, model_dir, workloads, engine, "runtime", log_dir)
            else:
                hf = [w for w in workloads if w.name in args.hf_workloads]
                rows += run_runtime(args, model_dir, hf, "hf", "hf", log_dir)
        except Exception as exc:  # one mode failing must not lose the others' figures
            print(f"{mode} FAILED: {type(exc).__name__}: {str(exc)[:2000]} (logs: {log_dir})", flush=True)
            failed = True
    print(
        f"\nrollout throughput, {args.model} ({args.device}), {args.prompts} x ({args.prompt_len} -> {args.new_tokens})"
    )
    print(format_table(args.model, rows))
    for line in target_lines(rows):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
