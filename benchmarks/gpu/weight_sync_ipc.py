"""Colocated weight sync by CUDA IPC on one GPU: time, effective GB/s and bit-exactness.

A producer process (the trainer rank's role) holds random Qwen3-style weights on the GPU; a second
process (the engine's role) holds its own parameters of the same names and shapes and loads each
payload through the hf server's own loader (``hf_weights.load_serialized_tensors`` ->
``protocol.deserialize_named_tensors`` -> ``HFEngine.load_named_tensors``, then a synchronize). The
payload strings are exactly what ``/update_weights_from_tensor`` carries; they travel over a pipe
here instead of HTTP (no Ray, no aiohttp server needed).

    python3 benchmarks/gpu/weight_sync_ipc.py --models 0.5b,1.5b,4b --json /tmp/sync.json
    python3 benchmarks/gpu/weight_sync_ipc.py --check        # tiny mixed-dtype model, many buckets

Per sync: flatten (copy into per-dtype buckets of --bucket-mb, synchronized), handles (IPC handle
creation and pickling), engine (open handles + copy into the parameters + synchronize, as the
engine answers; producer-side round trip). Median of --reps after one warm-up. After the timed
syncs the engine's per-tensor checksums (exact integer sums of the bit patterns, position-weighted)
must equal the producer's. Floor: bytes / 1 TB/s (CUDA IPC copy ceiling for 4 GiB buckets on an
H100, /work/shared/reference/performance.md). Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

Shapes = list[tuple[str, list[int], str]]  # name, shape, dtype name

# (hidden, layers, intermediate, heads, kv heads, head dim, vocab, tied)
MODELS: dict[str, tuple[int, int, int, int, int, int, int, bool]] = {
    "0.5b": (896, 24, 4864, 14, 2, 64, 151936, True),  # Qwen2.5-0.5B widths, Qwen3 q/k norms
    "1.5b": (1536, 28, 8960, 12, 2, 128, 151936, True),  # Qwen2.5-1.5B widths
    "4b": (2560, 36, 9728, 32, 8, 128, 151936, True),  # Qwen3-4B
    "tiny": (256, 2, 512, 4, 2, 64, 1000, False),
}


def qwen3_shapes(model: str, norm_dtype: str = "bfloat16") -> Shapes:
    h, layers, inter, heads, kv, hd, vocab, tied = MODELS[model]
    out: Shapes = [("model.embed_tokens.weight", [vocab, h], "bfloat16")]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", [heads * hd, h], "bfloat16"),
            (p + "self_attn.k_proj.weight", [kv * hd, h], "bfloat16"),
            (p + "self_attn.v_proj.weight", [kv * hd, h], "bfloat16"),
            (p + "self_attn.o_proj.weight", [h, heads * hd], "bfloat16"),
            (p + "self_attn.q_norm.weight", [hd], norm_dtype),
            (p + "self_attn.k_norm.weight", [hd], norm_dtype),
            (p + "mlp.gate_proj.weight", [inter, h], "bfloat16"),
            (p + "mlp.up_proj.weight", [inter, h], "bfloat16"),
            (p + "mlp.down_proj.weight", [h, inter], "bfloat16"),
            (p + "input_layernorm.weight", [h], norm_dtype),
            (p + "post_attention_layernorm.weight", [h], norm_dtype),
        ]
    out.append(("model.norm.weight", [h], norm_dtype))
    if not tied:
        out.append(("lm_head.weight", [vocab, h], "bfloat16"))
    return out


def random_tensors(shapes: Shapes, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return {
        name: torch.randn(shape, generator=gen, device="cuda", dtype=getattr(torch, dtype))
        for name, shape, dtype in shapes
    }


@torch.no_grad()
def checksums(named: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Exact integer sums of each tensor's bit patterns, plain and position-weighted."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    out = {}
    for name, t in named.items():
        bits = t.contiguous().view(ints[t.element_size()]).reshape(-1).to(torch.int64)
        weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
        out[name] = (int(bits.sum()), int((bits * weights).sum()))
    return out


def engine_main(conn: Any, shapes: Shapes) -> None:
    """The engine's process: its own parameters, loaded through the hf server's loader."""
    from rljob_runtime.rollout.hf_engine import HFEngine
    from rljob_runtime.rollout.hf_weights import load_serialized_tensors

    params = random_tensors(shapes, seed=12345)  # not the producer's values: a missed copy shows
    engine = HFEngine.__new__(HFEngine)  # only the weight loader: no model directory needed
    engine.lock = threading.Lock()
    engine.named_weights = lambda: params  # type: ignore[method-assign]
    conn.send("ready")
    while True:
        cmd, arg = conn.recv()
        if cmd == "load":
            start = time.perf_counter()
            count = sum(load_serialized_tensors(engine, p, "flattened_bucket") for p in arg)
            conn.send((count, time.perf_counter() - start))
        elif cmd == "checksums":
            conn.send(checksums(params))
        elif cmd == "state":  # torch.save bytes: no shared-memory tensor passing needed
            buffer = io.BytesIO()
            torch.save({k: v.cpu() for k, v in params.items()}, buffer)
            conn.send_bytes(buffer.getvalue())
        else:
            conn.send("bye")
            return


def sync_once(conn: Any, named: dict[str, torch.Tensor], bucket_bytes: int) -> dict[str, float]:
    from rljob_runtime.sync.buckets import flatten_buckets
    from rljob_runtime.sync.cuda_ipc import encode_bucket

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    buckets = flatten_buckets(named.items(), bucket_bytes)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    payloads = [encode_bucket(b) for b in buckets]
    t2 = time.perf_counter()
    conn.send(("load", payloads))
    count, engine_s = conn.recv()
    t3 = time.perf_counter()
    assert count == len(named), (count, len(named))
    del buckets  # the engine has answered: only now may the buckets go
    torch.cuda.ipc_collect()
    return {
        "flatten_s": t1 - t0,
        "handles_s": t2 - t1,
        "engine_s": engine_s,
        "engine_roundtrip_s": t3 - t2,
        "total_s": t3 - t0,
        "buckets": float(len(payloads)),
    }


def run_model(model: str, bucket_bytes: int, reps: int, check: bool) -> dict[str, Any]:
    shapes = qwen3_shapes(model, norm_dtype="float32" if check else "bfloat16")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=engine_main, args=(child, shapes), daemon=True)
    proc.start()
    try:
        assert parent.recv() == "ready"
        result: dict[str, Any] = {"model": model, "bucket_mb": bucket_bytes / 2**20}
        runs = []
        for rep in range(reps + 1):
            named = random_tensors(shapes, seed=rep)  # fresh values every sync
            runs.append(sync_once(parent, named, bucket_bytes))
            parent.send(("checksums", None))
            if parent.recv() != checksums(named):
                raise AssertionError(f"{model}: engine checksums differ after sync {rep}")
            if check:
                parent.send(("state", None))
                state = torch.load(io.BytesIO(parent.recv_bytes()), weights_only=True)
                bad = [k for k, v in named.items() if not torch.equal(state[k], v.cpu())]
                if bad:
                    raise AssertionError(f"{model}: not bit-exact: {bad[:5]}")
        size = sum(t.numel() * t.element_size() for t in named.values())
        timed = runs[1:]  # the first sync is the warm-up
        for key in timed[0]:
            result[key] = statistics.median(r[key] for r in timed)
        result.update(
            params=sum(t.numel() for t in named.values()),
            bytes=size,
            gb_per_s=size / result["total_s"] / 1e9,
            engine_gb_per_s=size / result["engine_s"] / 1e9,
            floor_s=size / 1e12,
            checksums_equal=True,
            syncs=len(runs),
        )
        parent.send(("stop", None))
        parent.recv()
        return result
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()


def copy_gb_per_s(nbytes: int = 4 << 30, reps: int = 5) -> float:
    """A plain device-to-device copy of ``nbytes`` (bytes copied / time), the same-process ceiling."""
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return nbytes / statistics.median(times) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="0.5b,1.5b,4b")
    parser.add_argument("--bucket-mb", type=float, default=1024)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="tiny mixed-dtype model, 64 KiB buckets")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.check:
        results = [run_model("tiny", 64 * 1024, reps=1, check=True)]
    else:
        bucket = int(args.bucket_mb * 2**20)
        results = [run_model(m, bucket, args.reps, check=False) for m in args.models.split(",")]
    copy = copy_gb_per_s()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; d2d copy {copy:.0f} GB/s (4 GiB)")
    print(
        "model  params   GB      buckets  flatten_s  handles_s  engine_s  total_s  GB/s   engine GB/s  floor_s"
    )
    for r in results:
        print(
            f"{r['model']:<6} {r['params'] / 1e9:5.2f}B  {r['bytes'] / 1e9:6.3f}  {r['buckets']:7.0f}  "
            f"{r['flatten_s']:9.4f}  {r['handles_s']:9.4f}  {r['engine_s']:8.4f}  {r['total_s']:7.4f}  "
            f"{r['gb_per_s']:6.1f}  {r['engine_gb_per_s']:11.1f}  {r['floor_s']:.4f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"d2d_copy_gb_per_s": copy, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
