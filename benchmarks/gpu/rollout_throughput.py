"""Rollout throughput: how much of stock SGLang's generation speed does the runtime's whole rollout
path (``RolloutManager.generate`` -> sglang-router -> engine) keep? One GPU, same model, same load,
output tokens per second. A benchmark script: it prints figures and never fails on a slow result.

Modes, each on the GPU alone (run one after the other in this process, each server stopped before
the next starts); each runs a small warm-up generation, then times every workload ``--runs`` times
(default 3: all printed, the best and the median kept):

- ``stock``: ``python -m sglang.launch_server`` started here with the command line the runtime's
  engine gets (``engine_actor.engine_command``: same flags, same ``--mem-fraction-static``, the
  memory saver when ``--placement colocated``), and a plain aiohttp client asking what the runtime
  asks (token ids and log-probs): every request posted to ``/generate`` at once (``concurrent``) and
  all of them as one batched request (``batch``), the better of the two being the reference.
  ``--stock-plain`` (on by default) adds an informational row without log-probs (never the
  reference: it returns less than the runtime needs). ``--stock-url`` measures a server already
  running instead (any SGLang-API server: the CPU test points it at rljob's hf server).
- ``runtime``: a local Ray, ``RolloutManager.create`` with one engine of ``rollout.engine: sglang``
  (health checks off), ``manager.generate`` as the driver calls it (logprobs on; one call per
  distinct ``max_new_tokens``, all in flight at once from threads), with as many requests in flight
  as the engine says it runs at once (``EngineClient.set_in_flight_limit``). ``--also-concurrency N``
  adds rows ``runtime@N``: the same path with at most N requests in flight (e.g. 512, the fixed
  per-engine limit the runtime had before).
- ``hf``: the same path with ``rollout.engine: hf`` (rljob's transformers server) on the GPU, for the
  ratio; slow, so by default only the ``fixed`` workload (``--hf-workloads``).

Workloads (random prompt ids in the tokenizer's vocabulary, fresh prompts for each timed run but the
same for every mode; ``ignore_eos``, so every request makes exactly its ``max_new_tokens``):

- ``fixed``: 2048 requests, 128 prompt tokens -> 256 new tokens (15-20 s a run for the 0.5b on an
  H100 or H200: shorter runs are too noisy to compare clients);
- ``longtail``: the same, but a seeded 5% of the requests (103 of 2048) ask 8x the median (2048).

Server flags: the kit's SGLang 0.5.16 has no FA3, so both stock and runtime get
``--attention-backend triton --sampling-backend pytorch --disable-flashinfer-autotune`` and
``--mem-fraction-static 0.8`` (``--mem-fraction``); CUDA graphs stay on (SGLang's default decode
graphs up to batch 256 on an H100/H200). ``--sglang-arg KEY=VALUE`` (repeatable; KEY without the
dashes; an empty VALUE: a bare flag) adds or replaces a flag for both; the runtime gets them as
``rollout.sglangArgs``.

Models: random-weight Qwen3 shapes (``model_dirs.py``: 0.5b, 1.5b, 4b, tiny) with SmolLM2's
tokenizer (its 49,152 tokens are the config's vocabulary), written once under
``--model-root``/smollm2 and reused.

Output: one JSON line per result as it comes, then a Markdown table (mode, model, workload,
requests, output tokens, seconds of each run, tok/s best and median, ratio to the stock reference),
the target lines ``runtime/stock >= 0.95: met|missed (...)`` and, with ``--json``, everything.
Exit status 1 only if a mode failed (the other modes' figures are still printed).

At the defaults (2048 requests, 3 runs, both workloads) each mode takes several minutes with its
server's start, so ``run.sh rollout`` runs stock and runtime as separate invocations, the second
with ``--stock-from`` (the ratio to the stock rows of the first). The hf engine is about 10x
slower: give mode hf its own, smaller stock run (the same ``--prompts``). The model directory is reused.

    # on the GPU machine (kit installed, e.g. CUDA_VISIBLE_DEVICES=0)
    python3 benchmarks/gpu/rollout_throughput.py --model 0.5b --modes stock \\
        --model-root /dev/shm/rljob-models --json t-0.5b-stock.json
    python3 benchmarks/gpu/rollout_throughput.py --model 0.5b --modes runtime --also-concurrency 512 \\
        --stock-from t-0.5b-stock.json --model-root /dev/shm/rljob-models --json t-0.5b.json
    python3 benchmarks/gpu/rollout_throughput.py --model 0.5b --modes stock hf --prompts 256 --runs 2 \\
        --model-root /dev/shm/rljob-models --json t-0.5b-hf.json
    # here (no GPU, no SGLang): the whole harness, rljob's hf server standing in for SGLang (~35 s)
    .venv/bin/python benchmarks/gpu/rollout_throughput.py --device cpu --engine hf --tiny
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/bench_cli.py
import throughput_report as report
from bench_cli import (
    add_device,
    add_engine,
    add_json,
    add_log_dir,
    add_mem_fraction,
    add_model_root,
    add_runs,
    add_seed,
    add_sglang_arg,
    dir_or_temp,
    resolve_engine,
    sglang_flags,
)
from bench_env import KIT_SGLANG_ARGS
from model_dirs import MODELS, ensure_model_dir

FULL = {"model": "0.5b", "prompts": 2048, "prompt_len": 128, "new_tokens": 256}
TINY = {"model": "tiny", "prompts": 4, "prompt_len": 8, "new_tokens": 8}
MODES = ("stock", "runtime", "hf")
CLIENTS = ("concurrent", "batch")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Rollout throughput: the runtime's path vs stock SGLang vs the hf engine (see the module docstring)."
    )
    p.add_argument("--model", choices=sorted(MODELS), default=None, help="default 0.5b (tiny with --tiny)")
    p.add_argument(
        "--tiny", action="store_true", help="tiny model, 4 requests of 8 -> 8 tokens (CPU harness)"
    )
    p.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=None,
        help="default: all (stock runtime with --engine hf)",
    )
    add_engine(
        p,
        help="the engine of modes stock and runtime: sglang (default on cuda) or hf (rljob's server "
        "standing in for SGLang; the default on cpu, where SGLang cannot run)",
    )
    p.add_argument("--workloads", nargs="+", choices=("fixed", "longtail"), default=["fixed", "longtail"])
    p.add_argument(
        "--hf-workloads",
        nargs="+",
        choices=("fixed", "longtail"),
        default=["fixed"],
        help="mode hf's workloads (it is ~10x slower; default fixed)",
    )
    p.add_argument("--prompts", type=int, default=None, help="requests per workload (default 2048)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 128)")
    p.add_argument(
        "--new-tokens", type=int, default=None, help="new tokens per request, the median (default 256)"
    )
    p.add_argument("--long-fraction", type=float, default=report.LONG_FRACTION)
    p.add_argument("--long-factor", type=int, default=report.LONG_FACTOR)
    add_runs(p, 3, help="timed runs of each workload per mode")
    add_seed(p)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--stock-clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    p.add_argument(
        "--stock-plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time stock (concurrent) without logprobs (informational, never the reference)",
    )
    p.add_argument(
        "--also-concurrency",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="also time the runtime's path with at most N requests in flight (rows runtime@N)",
    )
    p.add_argument("--stock-url", default=None, help="measure this running SGLang-API server as stock")
    p.add_argument(
        "--stock-from", type=Path, default=None, help="take the stock rows from an earlier run's --json"
    )
    add_mem_fraction(p, 0.8, help="--mem-fraction-static, stock and runtime")
    add_sglang_arg(p, help="an SGLang flag for stock and runtime (repeatable; KEY= alone: a bare flag)")
    p.add_argument(
        "--placement",
        choices=("colocated", "rollout"),
        default="colocated",
        help="colocated: the engine on a trainer's bundle with the memory saver (a colocated job); "
        "rollout: a rollout-only bundle, no memory saver (a disaggregated job's engine)",
    )
    add_device(p)
    add_model_root(p, help="model directories (reused)")
    add_log_dir(p, help="server, router and engine logs")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    add_json(p)
    args = p.parse_args(argv)
    base = TINY if args.tiny else FULL
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    resolve_engine(p, args)
    if args.modes is None:
        args.modes = list(MODES) if args.engine == "sglang" else ["stock", "runtime"]
    if args.engine == "hf" and "hf" in args.modes:
        args.modes = [m for m in args.modes if m != "hf"]  # runtime already is the hf engine's path
        print("note: --engine hf: mode hf is mode runtime; dropped", flush=True)
        if not args.modes:
            p.error("--engine hf --modes hf: nothing left to run (mode runtime is the hf engine's path)")
    if min(args.prompts, args.prompt_len, args.new_tokens, args.runs, *args.also_concurrency) < 1:
        p.error("--prompts, --prompt-len, --new-tokens, --runs and --also-concurrency must be positive")
    if not 0 < args.long_fraction < 0.5 or args.long_factor < 1:
        p.error("--long-fraction must be in (0, 0.5) and --long-factor at least 1")
    if args.stock_from is not None and "stock" in args.modes:
        p.error("--stock-from replaces mode stock: leave stock out of --modes")
    try:  # the job's admission rules (e.g. sglangArgs the runtime owns) fail now, not after a stock run
        job_spec(args, Path("/model"), args.engine)
    except Exception as exc:
        p.error(f"the runtime's job spec is refused: {exc}")
    return args


def sglang_args(args: argparse.Namespace) -> dict[str, str]:
    """The SGLang flags (without dashes) of both stock and runtime."""
    return {**KIT_SGLANG_ARGS, "mem-fraction-static": str(args.mem_fraction), **sglang_flags(args.sglang_arg)}


def dtype(args: argparse.Namespace) -> str:
    return "bfloat16" if args.device == "cuda" else "float32"


# ------------------------------------------------------------------- the stock client (any server)


def sampling_params(new_tokens: int, temperature: float) -> dict[str, Any]:
    """What the runtime sends (``generate.sampling_params_from_spec`` with these overrides)."""
    return {
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": new_tokens,
        "ignore_eos": True,
    }


def completion_tokens(answer: dict[str, Any]) -> int:
    meta = answer.get("meta_info") or {}
    if "completion_tokens" in meta:
        return int(meta["completion_tokens"])
    if meta.get("output_token_logprobs") is not None:
        return len(meta["output_token_logprobs"])
    return len(answer.get("output_ids") or [])


async def _post(session: Any, url: str, body: dict[str, Any]) -> Any:
    async with session.post(f"{url}/generate", json=body) as resp:
        answer = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"POST {url}/generate: HTTP {resp.status}: {str(answer)[:300]}")
        return answer


async def post_concurrent(
    url: str,
    prompts: Sequence[Sequence[int]],
    lengths: Sequence[int],
    *,
    temperature: float,
    logprobs: bool = False,
) -> list[int]:
    """Every prompt as its own ``/generate`` request, all at once; each answer's completion tokens."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)  # no client-side cap on connections
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:

        async def one(ids: Sequence[int], n: int) -> int:
            body = {"input_ids": list(ids), "sampling_params": sampling_params(n, temperature)}
            if logprobs:
                body["return_logprob"] = True
            return completion_tokens(await _post(session, url, body))

        return list(await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True))))


async def post_batch(
    url: str,
    prompts: Sequence[Sequence[int]],
    lengths: Sequence[int],
    *,
    temperature: float,
    logprobs: bool = False,
) -> list[int]:
    """All prompts in one batched ``/generate`` request (a list of sampling params, one each)."""
    import aiohttp

    body: dict[str, Any] = {
        "input_ids": [list(p) for p in prompts],
        "sampling_params": [sampling_params(n, temperature) for n in lengths],
    }
    if logprobs:
        body["return_logprob"] = True
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        answers = await _post(session, url, body)
    answers = answers if isinstance(answers, list) else [answers]
    return [completion_tokens(a) for a in answers]


def check_made(what: str, made: Sequence[int], asked: Sequence[int]) -> None:
    """Every request made exactly the tokens it asked (else the figures would mean nothing)."""
    wrong = [(i, m, a) for i, (m, a) in enumerate(zip(made, asked, strict=False)) if m != a]
    if len(made) != len(asked) or wrong:
        raise RuntimeError(
            f"{what}: {len(made)} answers for {len(asked)} requests; requests with another length than "
            f"asked (index, made, asked): {wrong[:5]} (ignore_eos not honoured?)"
        )


def measure_server(
    url: str,
    workloads: Sequence[report.Workload],
    *,
    model: str,
    engine: str,
    clients: Sequence[str] = CLIENTS,
    runs: int = 3,
    temperature: float = 1.0,
    plain_row: bool = True,
) -> list[dict[str, Any]]:
    """Time ``workloads`` against the SGLang-API server at ``url`` with each client asking logprobs
    (the runtime's outputs: the reference rows), and without them when ``plain_row`` (concurrent,
    informational), after one small warm-up: one row per client and workload, printed as it comes."""
    posts = {"concurrent": post_concurrent, "batch": post_batch}
    variants = [(c, True) for c in clients] + ([("concurrent", False)] if plain_row else [])
    first = workloads[0]
    warm = report.warmup_workload(first.prompt_len, first.vocab)
    check_made(
        "stock warm-up",
        asyncio.run(post_concurrent(url, warm.prompts(0), warm.new_tokens, temperature=temperature)),
        warm.new_tokens,
    )
    rows = []
    for workload in workloads:
        for client, logprobs in variants:
            seconds = []
            for run in range(runs):
                prompts = workload.prompts(run)
                started = time.perf_counter()
                made = asyncio.run(
                    posts[client](
                        url, prompts, workload.new_tokens, temperature=temperature, logprobs=logprobs
                    )
                )
                seconds.append(time.perf_counter() - started)
                check_made(f"stock {client} {workload.name}", made, workload.new_tokens)
            rows.append(
                report.row(
                    "stock",
                    model=model,
                    engine=engine,
                    workload=workload,
                    seconds=seconds,
                    client=client + ("+logprobs" if logprobs else ""),
                    reference=logprobs,
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ------------------------------------------------------------------------------ the stock server


def memory_saver(args: argparse.Namespace) -> bool:
    """As ``RolloutManager.create``: colocated SGLang engines run with the memory saver."""
    return args.placement == "colocated" and args.engine == "sglang"


@contextlib.contextmanager
def stock_server(args: argparse.Namespace, model_dir: Path, log_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """The server the runtime's engine 0 would be (``EngineProcess``: the same command line and
    environment), without Ray, the manager or the router; yields (URL, command). Afterwards its whole
    process group is gone (its GPU memory free for the next mode)."""
    from rljob_runtime.rollout import procs
    from rljob_runtime.rollout.engine_actor import EngineProcess

    engine = EngineProcess(
        kind=args.engine,
        model_path=str(model_dir),
        dtype=dtype(args),
        device=args.device,
        seed=0,  # engine 0's
        enable_memory_saver=memory_saver(args),
        sglang_args=sglang_args(args) if args.engine == "sglang" else None,
        log_dir=str(log_dir / "stock"),
        startup_timeout_s=args.startup_timeout,
    )
    try:
        url = engine.start()
        print("stock server:", " ".join(engine.command), flush=True)
        yield url, engine.command
    finally:
        pid = engine.pid()
        engine.shutdown()
        deadline = time.monotonic() + 30
        while pid is not None and procs.group_pids(pid) and time.monotonic() < deadline:
            time.sleep(0.2)


def run_stock(
    args: argparse.Namespace, model_dir: Path, workloads: Sequence[report.Workload], log_dir: Path
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    common = dict(
        model=args.model,
        clients=args.stock_clients,
        runs=args.runs,
        temperature=args.temperature,
        plain_row=args.stock_plain,
    )
    if args.stock_url:
        rows = measure_server(args.stock_url.rstrip("/"), workloads, engine="external", **common)
        return rows, {"stock_url": args.stock_url}
    started = time.monotonic()
    with stock_server(args, model_dir, log_dir) as (url, cmd):
        ready_s = time.monotonic() - started
        print(f"stock server ready in {ready_s:.1f} s", flush=True)
        rows = measure_server(url, workloads, engine=args.engine, **common)
    return rows, {"stock_command": cmd, "stock_ready_s": round(ready_s, 1)}


# ---------------------------------------------------------------------------- the runtime's path


def job_spec(args: argparse.Namespace, model_dir: Path, engine: str) -> Any:
    """An RLTrainingJob spec with one engine of ``engine`` on one device (health checks off)."""
    from rljob_runtime.config import config_from_document

    resources: dict[str, Any] = {"device": args.device, "trainer": {"nodes": 1, "gpusPerNode": 1}}
    if args.placement == "colocated":
        resources["colocate"] = True
    else:
        resources |= {"colocate": False, "rollout": {"gpus": 1, "gpusPerEngine": 1}}
    doc = {
        "model": {"path": str(model_dir), "dtype": dtype(args)},
        "data": {"path": "/unused.jsonl"},
        "rollout": {
            "engine": engine,
            "batchSize": 1,
            "nSamplesPerPrompt": 1,
            "temperature": args.temperature,
            "topP": 1.0,
            "sglangArgs": sglang_args(args) if engine == "sglang" else {},
        },
        "training": {"backend": "torch", "globalBatchSize": 1},
        "resources": resources,
        "faultTolerance": {"engineHealthCheck": {"enabled": False}},
    }
    return config_from_document(doc).spec


def make_placement(spec: Any, timeout_s: float = 120.0) -> Any:
    """Colocated: the job's own placement (one trainer bundle the engine shares). Disaggregated: the
    rollout bundle alone (no trainer runs here, so its GPU is not reserved)."""
    import ray
    from ray.util.placement_group import placement_group

    from rljob_api.contract import RAY_RESOURCE_ROLLOUT
    from rljob_runtime import placement as pl

    if spec.resources.colocate:
        return pl.create_placement(spec, timeout_s=timeout_s)
    shapes = [b for b in pl.bundle_shapes(spec) if RAY_RESOURCE_ROLLOUT in b]
    group = placement_group(shapes, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        raise RuntimeError(f"could not place the rollout bundle {shapes} in {timeout_s:.0f} s")
    return pl.Placement([], [pl.Slot(group, i) for i in range(len(shapes))], False, 1)


def generate_workload(
    manager: Any, workload: report.Workload, run: int, temperature: float, pool: ThreadPoolExecutor
) -> float:
    """One timed rollout of ``workload``: ``manager.generate`` per distinct ``max_new_tokens``, all
    at once; seconds from the first call to the last answer."""
    from rljob_runtime.data.sample import Sample

    prompts = workload.prompts(run)
    groups = {
        n: [Sample(group_index=i, index=i, prompt_ids=list(prompts[i])) for i in indices]
        for n, indices in workload.by_length().items()
    }
    params = dict(ignore_eos=True, temperature=temperature, top_p=1.0, top_k=-1)
    started = time.perf_counter()
    futures = [
        pool.submit(manager.generate, samples, max_new_tokens=n, **params) for n, samples in groups.items()
    ]
    done = [f.result() for f in futures]
    seconds = time.perf_counter() - started
    made = [0] * workload.requests
    for samples in done:
        for s in samples:
            made[s.index] = s.response_length
    check_made(f"{workload.name} run {run}", made, workload.new_tokens)
    return seconds


def run_runtime(
    args: argparse.Namespace,
    model_dir: Path,
    workloads: Sequence[report.Workload],
    *,
    engine: str,
    mode: str,
    log_dir: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The driver's rollout path, on the local Ray ``main`` started: RolloutManager -> router -> engine."""
    import ray

    from rljob_runtime.rollout.manager import RolloutManager

    spec = job_spec(args, model_dir, engine)
    placement = make_placement(spec)
    manager = None
    rows = []
    ready_s, in_flight = -1.0, -1
    try:
        started = time.monotonic()
        manager = RolloutManager.create(
            spec, model_dir, placement, log_dir=log_dir / mode, startup_timeout_s=args.startup_timeout
        )
        ready_s = time.monotonic() - started
        in_flight = manager.client.concurrency
        print(
            f"{mode}: engine and router ready in {ready_s:.1f} s, {in_flight} requests in flight", flush=True
        )
        first = workloads[0]
        caps = [(mode, in_flight)] + [
            (f"{mode}@{n}", n) for n in (args.also_concurrency if mode == "runtime" else [])
        ]
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="generate") as pool:
            generate_workload(
                manager, report.warmup_workload(first.prompt_len, first.vocab), 0, args.temperature, pool
            )
            for workload in workloads:
                for name, cap in caps:
                    manager.client.concurrency = cap
                    seconds = [
                        generate_workload(manager, workload, run, args.temperature, pool)
                        for run in range(args.runs)
                    ]
                    rows.append(
                        report.row(name, model=args.model, engine=engine, workload=workload, seconds=seconds)
                    )
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        if manager is not None:
            manager.shutdown()
        groups = {id(slot.group): slot.group for slot in [*placement.trainer, *placement.rollout]}
        for group in groups.values():
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)
    return rows, {f"{mode}_ready_s": round(ready_s, 1), f"{mode}_in_flight": in_flight}


def start_ray(args: argparse.Namespace, model_dir: Path) -> None:
    import ray

    from rljob_runtime import placement as pl

    resources = pl.local_resources(job_spec(args, model_dir, "hf"))
    ray.init(num_cpus=4, resources=resources, include_dashboard=False, log_to_driver=False)


# -------------------------------------------------------------------------------------------- main


def gpu_name() -> str | None:
    """From nvidia-smi: this process never touches CUDA (its context would take GPU memory)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.strip().splitlines()
    return names[0] if out.returncode == 0 and names else None


def model_dir_for(args: argparse.Namespace) -> Path:
    """``<root>/smollm2/qwen3-<model>``: written once (on the CPU), SmolLM2's tokenizer and vocabulary."""
    from rljob_runtime.models.smollm2 import smollm2_tokenizer_dir

    root = dir_or_temp(args.model_root, "rljob-throughput-")
    started = time.monotonic()
    path = ensure_model_dir(root / "smollm2", args.model, tokenizer=smollm2_tokenizer_dir(), device="cpu")
    print(f"model {args.model}: {path} ({time.monotonic() - started:.1f} s)", flush=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = dir_or_temp(args.log_dir, "rljob-throughput-logs-")
    log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir_for(args)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    workloads = report.make_workloads(
        args.workloads,
        requests=args.prompts,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        vocab=vocab,
        seed=args.seed,
        long_fraction=args.long_fraction,
        long_factor=args.long_factor,
    )
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"gpu": gpu_name() if args.device == "cuda" else None, "logs": str(log_dir)}
    if args.stock_from is not None:
        rows += report.stock_rows_from(
            json.loads(args.stock_from.read_text()), model=args.model, workloads=workloads
        )
        extra["stock_from"] = str(args.stock_from)
    failed = []
    ray_started = False
    try:
        for mode in args.modes:
            try:
                if mode == "stock":
                    got, info = run_stock(args, model_dir, workloads, log_dir)
                else:
                    if not ray_started:
                        start_ray(args, model_dir)
                        ray_started = True
                    if mode == "runtime":
                        got, info = run_runtime(
                            args, model_dir, workloads, engine=args.engine, mode=mode, log_dir=log_dir
                        )
                    else:
                        mine = [w for w in workloads if w.name in args.hf_workloads]
                        got, info = run_runtime(
                            args, model_dir, mine, engine="hf", mode=mode, log_dir=log_dir
                        )
                rows += got
                extra.update(info)
            except Exception as exc:  # one mode failing must not lose the others' figures
                print(f"{mode} FAILED: {type(exc).__name__}: {str(exc)[:3000]} (logs: {log_dir})", flush=True)
                failed.append(mode)
    finally:
        if ray_started:
            import ray

            ray.shutdown()
    flags = " ".join(f"--{k}" + (f" {v}" if v else "") for k, v in sglang_args(args).items())
    print(
        f"\nrollout throughput: {args.model} ({args.device}, {extra.get('gpu') or 'no GPU'}), {args.prompts} requests "
        f"of {args.prompt_len} -> {args.new_tokens} tokens, placement {args.placement}, engine {args.engine}"
        + (f", SGLang flags: {flags}" if args.engine == "sglang" else "")
    )
    print(f"best and median of {args.runs} runs; vs stock: against the better stock client (*)\n")
    print(report.format_table(rows))
    for line in report.target_lines(rows):
        print(line)
    if failed:
        print(f"failed modes: {', '.join(failed)}")
    if args.json:
        document = report.report(
            rows,
            workloads=workloads,
            args=vars(args),
            extra={**extra, "sglang_args": sglang_args(args), "failed_modes": failed},
        )
        report.write_json(args.json, document)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
