"""Forward + backward throughput of the megatron backend's model with padded micro-batches
(``training.microBatchSize``) against token-budget packed ones (``training.dynamicBatch``), on one GPU.

A random-weight Qwen3-style model (``--shape``: megatron_mfu.py's 1b / 4b, or a tiny one for a CPU smoke
run), one global batch of ``--rows`` samples with a seeded long-tail length mix (most a few hundred
tokens, a few near ``--max-len``), the RL trainer's loss path: the model's logits gathered at the
response positions into per-token log-probs (``schedule.token_stats``), summed and backpropagated.
Padded: the rows in rollout order, ``--micro-batch-size`` per micro-batch, each padded to its longest;
packed: ``algo.packing``'s micro-batches of at most ``--max-tokens`` tokens, run as one thd sequence
each (``schedule.model_inputs``: PackedSeqParams, SdpaAttention's varlen kernel on CUDA).

tokens/s counts real tokens (prompt + response, no padding) per second of forward + backward over the
whole global batch (``--steps`` timed repeats after ``--warmup``); ``computed_tokens`` is what the model
ran (padding included). One JSON line per mode, then a summary line with the gain.

    python3 benchmarks/gpu/dynamic_batch.py --shape 1b --json /tmp/dynamic_batch.json
    python3 benchmarks/gpu/dynamic_batch.py --shape tiny --device cpu  # smoke run, seconds
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
try:
    import rljob_runtime  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path[:0] = [str(REPO / "runtime"), str(REPO / "api")]
# The sibling megatron_mfu.py (its model shapes), and benchmarks/bench_cli.py.
sys.path[:0] = [str(HERE), str(HERE.parent)]

from bench_cli import add_device, add_json, add_seed, add_steps_and_warmup, doc_parser  # noqa: E402
from megatron_mfu import MODELS  # noqa: E402

from rljob_runtime.algo.packing import plan_micro_batches  # noqa: E402
from rljob_runtime.data.sample import Sample  # noqa: E402
from rljob_runtime.trainer.base import TrainBatch, build_batch  # noqa: E402
from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    **MODELS,
    "tiny": {
        **QWEN3_0_6B,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
    },
}


def long_tail_lengths(rows: int, max_len: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, response) lengths: 80% short (total <= max_len / 8), 15% medium (<= max_len / 2), 5% (at
    least one) near max_len; prompts 5-25% of each total. Seeded, in a shuffled (rollout) order."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        roll = rng.random()
        if i == 0 or roll < 0.05:
            total = rng.randint(int(max_len * 0.9), max_len)
        elif roll < 0.2:
            total = rng.randint(max_len // 8, max_len // 2)
        else:
            total = rng.randint(max(max_len // 64, 4), max_len // 8)
        prompt = max(1, int(total * rng.uniform(0.05, 0.25)))
        out.append((prompt, total - prompt))
    rng.shuffle(out)
    return out


def make_batch(lengths: list[tuple[int, int]], vocab: int, seed: int) -> TrainBatch:
    gen = torch.Generator().manual_seed(seed)
    samples = [
        Sample(
            prompt_ids=torch.randint(0, vocab, (p,), generator=gen).tolist(),
            response_ids=torch.randint(0, vocab, (r,), generator=gen).tolist(),
        )
        for p, r in lengths
    ]
    return build_batch(samples)


def micro_batches(batch: TrainBatch, mode: str, mbs: int, max_tokens: int) -> list[TrainBatch]:
    if mode == "packed":
        plan = plan_micro_batches(batch.sequence_lengths(), max_tokens)
        return [batch.select(rows) for rows in plan]
    return [batch.select(slice(i, i + mbs)) for i in range(0, batch.size, mbs)]


def init(device: str) -> None:
    """One rank (gloo on CPU, NCCL on CUDA) and megatron-core's groups; on CPU the patches that let
    megatron-core run there."""
    from rljob_runtime.trainer.megatron.model import init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    if device == "cpu":
        from rljob_runtime.trainer.megatron.testing import cpu_patches

        cpu_patches()
    init_model_parallel(Parallelism())


def run_mode(
    model: Any, shape: Any, mbs: list[TrainBatch], mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    from rljob_runtime.trainer.megatron.schedule import model_inputs, token_stats

    device = torch.device(args.device)
    packed = mode == "packed"

    def one_pass() -> None:
        for mb in mbs:
            inputs, kwargs = model_inputs(mb, device, packed=packed)
            logits = model(*inputs, **kwargs)
            logp, _ = token_stats(logits, mb, shape.vocab_size, 1.0, None, packed=packed)
            (-logp.float().sum() / 1000.0).backward()
        model.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        one_pass()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        one_pass()
    sync()
    seconds = (time.perf_counter() - start) / args.steps
    real = sum(sum(mb.sequence_lengths()) for mb in mbs)
    computed = real if packed else sum(mb.size * int(mb.input_ids.shape[1]) for mb in mbs)
    return {
        "mode": mode,
        "shape": args.shape,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "rows": args.rows,
        "micro_batches": len(mbs),
        "micro_batch_size": args.micro_batch_size if not packed else None,
        "max_tokens_per_gpu": args.max_tokens if packed else None,
        "real_tokens": real,
        "computed_tokens": computed,
        "step_s": round(seconds, 4),
        "tokens_per_s": round(real / seconds, 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device.type == "cuda"
        else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = doc_parser(__doc__)
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    add_device(parser)
    parser.add_argument("--rows", type=int, default=64, help="samples in the global batch")
    parser.add_argument("--max-len", type=int, default=4096, help="longest sample (prompt + response)")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="padded mode's rows per pass")
    parser.add_argument("--max-tokens", type=int, default=16384, help="packed mode's maxTokensPerGpu")
    add_steps_and_warmup(parser, steps=3, warmup=1)
    add_seed(parser)
    add_json(parser, help="also write the results (a list) to this path")
    args = parser.parse_args(argv)
    if args.max_tokens < args.max_len:
        parser.error("--max-tokens must hold the longest sample (--max-len), as admission requires")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu (with --shape tiny)", file=sys.stderr)
        return 2
    from rljob_runtime.trainer.megatron import model_shape
    from rljob_runtime.trainer.megatron.model import build_gpt_model
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    torch.manual_seed(args.seed)
    init(args.device)
    shape = model_shape(SHAPES[args.shape])
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_gpt_model(shape, Parallelism(), dtype=dtype)
    batch = make_batch(long_tail_lengths(args.rows, args.max_len, args.seed), shape.vocab_size, args.seed)
    results = []
    for mode in ("padded", "packed"):
        mbs = micro_batches(batch, mode, args.micro_batch_size, args.max_tokens)
        result = run_mode(model, shape, mbs, mode, args)
        results.append(result)
        print(json.dumps(result), flush=True)
    padded, packed = results
    summary = {
        "summary": "dynamic_batch",
        "shape": args.shape,
        "gain": round(packed["tokens_per_s"] / padded["tokens_per_s"], 3),
        "padding_fraction": round(1 - padded["real_tokens"] / padded["computed_tokens"], 3),
        "micro_batches": {"padded": padded["micro_batches"], "packed": packed["micro_batches"]},
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps([*results, summary], indent=2) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
