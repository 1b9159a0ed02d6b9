"""Weight sync trainer -> rollout engine through the full path: name conversion, the hf engine's HTTP
server, pause / flush / transfer / continue, bit-exactness checked from outside the engine.

    python3 benchmarks/gpu/weight_sync_path.py --transport ipc --models 0.5b,1.5b,4b --json /tmp/ipc.json
    python3 benchmarks/gpu/weight_sync_path.py --transport nccl --models 0.5b,1.5b,4b --json /tmp/nccl.json
    python3 benchmarks/gpu/weight_sync_path.py --transport ipc --tiny          # quick check (seconds)
    python3 benchmarks/gpu/weight_sync_path.py --cpu --transport tensors --tiny  # the harness alone, no GPU

This process plays the trainer (the megatron backend's rank 0): it holds random Qwen3-style weights
in Megatron's layout (fused qkv and gate/up, padded vocab; built once with ``hf_to_megatron``) on
its GPU. The engine is a real ``python -m rljob_runtime.rollout.hf_server`` subprocess, loaded from
a model directory written for it (Qwen3 config.json, random bf16 model.safetensors, a five-word
tokenizer; both in ``sync_engine.py``). Each sync does what the runtime does (``sync.WeightSync`` + ``RolloutManager.
_update_engine``), phase by phase (seconds; the producer's GPU synchronized at each boundary,
except in the nccl driver):

- ``convert``: ``megatron_to_hf`` on the GPU (``--no-convert``: the producer holds HF tensors).
- ipc: ``share`` (``IpcProducer.share``: flatten into --bucket-mb buckets, default the runtime's
  2 GiB (``cuda_ipc.IPC_BUCKET_BYTES``), + IPC handles), ``pause``
  (POST /pause_generation), ``flush`` (GET /flush_cache until 200), ``transfer`` (one POST
  /update_weights_from_tensor per bucket; the engine opens the handle, copies into its parameters
  and synchronizes before answering), ``continue`` (POST /continue_generation), ``release``
  (``IpcProducer.release``). Engine and producer share cuda:0 (colocated).
- nccl (as ``WeightSync._push_broadcast``): the trainer's side starts at once in a worker thread,
  ``convert`` then ``sender`` (``NcclSender.send``: pack + broadcast every bucket, two in flight),
  while this thread drives the engine: ``pause``, ``flush``, ``transfer`` (one POST
  /update_weights_from_distributed per 1 GiB bucket, each answered once the engine queued its
  receive and copies, the last once all of them are done), ``continue``; so convert and sender
  overlap the driver's phases, and one bucket's broadcast the next one's request. Producer on cuda:0, engine
  on cuda:1. The group is made once per model (``init_s``: POST /init_weights_update_group while
  this process hosts the store as rank 0); NCCL creates its communicator at the first broadcast,
  so the warm-up sync (``warmup_total_s``) carries that. ``pack_alone_s``: packing every bucket
  without sending (part of ``sender``).
- tensors (``--cpu`` harness check, not a benchmark): CPU serialization over HTTP.

Reported per model: median of each phase and of ``total_s`` over --reps after one warm-up (a median
total is not the sum of the median phases), bytes (the HF tensors sent), effective GB/s = bytes /
total, and the floor = bytes / --floor-gbps beside it. Floor assumptions (override with
--floor-gbps): ipc 1000 GB/s, the CUDA IPC copy into the engine's own buffer for GiB buckets
measured on one H100 (0.65-1.2 TB/s, /work/shared/reference/performance.md); nccl 450 GB/s, NVLink
one way between two H100s. Targets (--target-gbps): ipc 200 GB/s, nccl 150 GB/s, judged on 4b.

The engine is idle (no generation in flight), so pause and flush measure the protocol, not a batch
draining. Before each sync the producer's weights get new random values; after it the engine's
exact per-tensor checksums (GET /weights_checksum) and weight version must equal the producer's,
or the script fails (exit 1). Model directories go under /dev/shm when it has room (else the temp
dir) and are removed after each model unless --model-root keeps (and reuses) them. Server logs:
--log-dir (a new temp dir by default), their tail printed when a server fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _path in (REPO / "runtime", REPO / "api", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from sync_engine import (  # noqa: E402
    LOCALHOST,
    BenchmarkError,
    EngineServer,
    Tensors,
    model_dir,
    nbytes,
)
from weight_sync_ipc import MODELS, copy_gb_per_s  # noqa: E402

from rljob_runtime.net import free_port  # noqa: E402
from rljob_runtime.rollout import protocol  # noqa: E402
from rljob_runtime.sync.buckets import plan_buckets  # noqa: E402
from rljob_runtime.sync.checksum import checksums  # noqa: E402
from rljob_runtime.trainer.megatron.arch import ModelShape, model_shape  # noqa: E402
from rljob_runtime.trainer.megatron.convert import hf_to_megatron, megatron_to_hf  # noqa: E402
from rljob_runtime.trainer.megatron.parallel import padded_vocab_size  # noqa: E402
from rljob_runtime.trainer.megatron.testing import random_hf_state  # noqa: E402

Timings = dict[str, float]

TRANSPORTS = ("ipc", "nccl", "tensors")
FLOOR_GBPS = {"ipc": 1000.0, "nccl": 450.0, "tensors": 1.0}
TARGET_GBPS = {"ipc": 200.0, "nccl": 150.0}
TARGET_MODEL = "4b"
PHASES = (
    "convert_s",
    "share_s",
    "pause_s",
    "flush_s",
    "transfer_s",
    "continue_s",
    "release_s",
    "sender_s",
    "total_s",
)
# The hf server's own timing of each /update_weights_from_tensor (its ``timings_ms``), summed over the
# buckets of a sync: inside ``transfer``, and what the rest of ``transfer`` is not (HTTP, JSON).
SERVER_PHASES = ("queue_ms", "decode_ms", "copy_ms", "sync_ms", "release_ms")
GROUP_NAME = "rljob_bench_weight_sync"
DIR_SEED = 10_000  # the engine's initial weights: never equal to a synced version


# ---------------------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default="ipc")
    parser.add_argument("--models", default="0.5b,1.5b,4b", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--tiny", action="store_true", help="the 'tiny' shape only (quick check)")
    parser.add_argument("--reps", type=int, default=5, help="timed syncs per model, after one warm-up")
    parser.add_argument(
        "--bucket-mb", type=float, default=None, help="default: the runtime's (ipc 2048, nccl 1024)"
    )
    parser.add_argument("--no-convert", action="store_true", help="the producer holds HF tensors: no convert")
    parser.add_argument("--floor-gbps", type=float, help="reference bandwidth (default: per transport)")
    parser.add_argument(
        "--target-gbps", type=float, help=f"GB/s {TARGET_MODEL} must reach (default: per transport)"
    )
    parser.add_argument("--cpu", action="store_true", help="harness check on CPU (tensors; nccl over gloo)")
    parser.add_argument("--model-root", type=Path, help="keep model directories here and reuse them")
    parser.add_argument("--log-dir", type=Path, help="server logs (default: a new temp dir)")
    parser.add_argument("--server-timeout", type=float, default=600, help="seconds for a server to load")
    parser.add_argument("--request-timeout", type=float, default=300, help="seconds per engine request")
    parser.add_argument(
        "--group-timeout", type=float, default=120, help="nccl: seconds to form the group / per collective"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.models = ["tiny"] if args.tiny else [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        parser.error(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.cpu and args.transport == "ipc":
        parser.error("CUDA IPC needs a GPU; on CPU use --transport tensors or nccl (gloo)")
    if args.floor_gbps is None:
        args.floor_gbps = FLOOR_GBPS[args.transport]
    if args.target_gbps is None:
        args.target_gbps = TARGET_GBPS.get(args.transport)
    if args.bucket_mb is not None and args.bucket_mb <= 0:
        parser.error(f"--bucket-mb must be positive, got {args.bucket_mb}")
    if args.bucket_mb is None:  # what WeightSync uses for this transport
        from rljob_runtime.sync.buckets import DEFAULT_BUCKET_BYTES
        from rljob_runtime.sync.cuda_ipc import IPC_BUCKET_BYTES

        args.bucket_mb = (IPC_BUCKET_BYTES if args.transport == "ipc" else DEFAULT_BUCKET_BYTES) / 2**20
    args.bucket_bytes = int(args.bucket_mb * 2**20)
    return args


def devices(args: argparse.Namespace) -> tuple[torch.device, torch.device]:
    """(producer, engine); refuses what this machine cannot run."""
    if args.cpu:
        return torch.device("cpu"), torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    needed = 2 if args.transport == "nccl" else 1
    if count < needed:
        raise SystemExit(
            f"--transport {args.transport} needs {needed} GPU(s), this machine has {count}; "
            "without GPUs, --cpu --transport tensors (or nccl over gloo) checks the harness"
        )
    engine = 1 if args.transport == "nccl" else 0
    return torch.device("cuda", 0), torch.device("cuda", engine)


# ------------------------------------------------------------------------------------ model shapes


def qwen3_config(model: str) -> dict[str, Any]:
    """Keyword arguments of transformers' Qwen3Config for one of ``MODELS`` (weight_sync_ipc.py)."""
    hidden, layers, inter, heads, kv, head_dim, vocab, tied = MODELS[model]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 4096,  # small rotary cache: the engine never generates here
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "bos_token_id": None,
        "pad_token_id": 1,  # of the tokenizer below
        "eos_token_id": 2,
    }


def to_hf(state: Tensors, shape: ModelShape, convert: bool) -> Tensors:
    """The tensors one sync sends, by HF name (tied models: no lm_head.weight, as the trainer)."""
    return megatron_to_hf(state, shape) if convert else dict(state)


@torch.no_grad()
def randomize_(state: Tensors, seed: int) -> None:
    """New values in place, so every sync moves different bytes (a skipped copy shows)."""
    device = next(iter(state.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for tensor in state.values():
        tensor.normal_(0.0, 0.02, generator=gen)


# ------------------------------------------------------------------------------------- transports


class Clock:
    """Consecutive phase durations. With ``sync_device`` it synchronizes the producer's GPU at each
    mark, so queued work lands in the phase that queued it; the NCCL driver must not (a queued
    broadcast waits for the engine, which waits for the driver's next request)."""

    def __init__(self, device: torch.device, sync_device: bool = True) -> None:
        self.sync_device = sync_device and device.type == "cuda"
        self.device = device
        self._sync()
        self.start = self.last = time.perf_counter()
        self.phases: Timings = {}

    def _sync(self) -> None:
        if self.sync_device:
            torch.cuda.synchronize(self.device)

    def mark(self, phase: str) -> None:
        self._sync()
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def result(self) -> Timings:
        return {**self.phases, "total_s": self.last - self.start}


class Transport:
    """One engine update, as ``sync.WeightSync`` and ``RolloutManager._update_engine`` do it."""

    def __init__(
        self, server: EngineServer, shape: ModelShape, device: torch.device, args: argparse.Namespace
    ) -> None:
        self.server, self.shape, self.device = server, shape, device
        self.convert = not args.no_convert
        self.bucket_bytes = args.bucket_bytes
        self.group_timeout = args.group_timeout
        self.buckets = 0

    def setup(self, hf: Tensors) -> Timings:
        """One-time work before the first sync (``hf``: what a sync sends); its timings."""
        return {}

    def sync(self, state: Tensors, version: str) -> tuple[Timings, Tensors]:
        """Timings of one sync and the HF tensors it sent."""
        raise NotImplementedError

    def close(self, graceful: bool = True) -> None:
        """Undo ``setup``; ``graceful`` False after a failure (nothing that could wait on the engine)."""

    def pause_and_flush(self, clock: Clock) -> None:
        self.server.expect("POST", "/pause_generation", protocol.pause_body())
        clock.mark("pause_s")
        self.server.flush_cache()
        clock.mark("flush_s")

    def resume(self, clock: Clock) -> None:
        self.server.expect("POST", "/continue_generation", {})
        clock.mark("continue_s")


class HttpBuckets(Transport):
    """The trainer's payloads first (convert, share), then the engine's update: pause, flush, one
    POST /update_weights_from_tensor per bucket (the version moves with the last), continue; then
    ``finish`` (``WeightSync._push_ipc``'s order)."""

    def payloads(self, hf: Tensors) -> list[str]:
        raise NotImplementedError

    def finish(self, clock: Clock) -> None:
        """Producer work once the engine has answered."""

    def sync(self, state: Tensors, version: str) -> tuple[Timings, Tensors]:
        clock = Clock(self.device)
        hf = to_hf(state, self.shape, self.convert)
        if self.convert:
            clock.mark("convert_s")
        payloads = self.payloads(hf)
        self.buckets = len(payloads)
        clock.mark("share_s")
        self.pause_and_flush(clock)
        server = dict.fromkeys(SERVER_PHASES, 0.0)
        try:
            for i, payload in enumerate(payloads):
                last = i == len(payloads) - 1
                body = protocol.update_weights_from_tensor_body(
                    [payload], load_format="flattened_bucket", weight_version=version if last else None
                )
                answer = self.server.expect("POST", "/update_weights_from_tensor", body)
                for phase, ms in (answer.get("timings_ms") or {}).items():
                    if phase in server:
                        server[phase] += float(ms)
            clock.mark("transfer_s")
        finally:  # as the manager: the engine never stays paused
            self.resume(clock)
        self.finish(clock)
        return {**clock.result(), **server_timings(server)}, hf


def server_timings(summed_ms: dict[str, float]) -> Timings:
    """The hf server's phases as ``srv_<phase>_s`` timings (not in ``PHASES``: they lie inside
    ``transfer_s`` and must not be added to the consecutive phases)."""
    return {f"srv_{phase.removesuffix('_ms')}_s": ms / 1e3 for phase, ms in summed_ms.items()}


class IpcTransport(HttpBuckets):
    def __init__(self, *args: Any) -> None:
        from rljob_runtime.sync.cuda_ipc import IpcProducer

        super().__init__(*args)
        self.producer = IpcProducer()

    def payloads(self, hf: Tensors) -> list[str]:
        return self.producer.share(hf.items(), self.bucket_bytes)  # flatten + handles

    def finish(self, clock: Clock) -> None:
        self.producer.release()  # the engine has copied: the buckets may go
        clock.mark("release_s")

    def close(self, graceful: bool = True) -> None:
        self.producer.release()


class TensorsTransport(HttpBuckets):
    """The CPU wire format (``protocol.serialize_named_tensors``), for a harness check without GPUs."""

    def payloads(self, hf: Tensors) -> list[str]:
        return [
            protocol.serialize_named_tensors(items, flattened_bucket=True)
            for items in plan_buckets(hf.items(), self.bucket_bytes)
        ]


class NcclTransport(Transport):
    """SGLang's distributed update, as ``WeightSync._push_broadcast``: the trainer's side (here a
    worker thread: convert, then ``NcclSender.send`` of every bucket) starts at once and runs while
    the driver (this thread) pauses and flushes the engine and posts one
    /update_weights_from_distributed per bucket, each answered once the engine received and loaded
    it; then continue. ``convert_s`` and ``sender_s`` (pack + broadcast of all buckets) are the
    worker's and overlap the driver's phases."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="producer")
        self.group: Any = None
        self.sender: Any = None
        self.specs: list[Any] = []

    def setup(self, hf: Tensors) -> Timings:
        from rljob_runtime.sync.nccl import NcclSender, WeightUpdateGroup, bucket_specs

        self.specs = bucket_specs(hf.items(), self.bucket_bytes)  # planned once, as the trainer does
        self.buckets = len(self.specs)
        port = free_port(LOCALHOST)
        body = protocol.init_weights_update_group_body(
            master_address=LOCALHOST,
            master_port=port,
            rank_offset=1,
            world_size=2,
            group_name=GROUP_NAME,
            backend=self.backend,
        )
        body["timeout_s"] = self.group_timeout  # the hf engine's extension: a stuck collective ends sooner
        started = time.perf_counter()
        # both block until the other has joined: the engine's answer, our store (rank 0 hosts it)
        joined = self.pool.submit(self.server.expect, "POST", "/init_weights_update_group", body)
        group = self.pool.submit(
            WeightUpdateGroup,
            LOCALHOST,
            port,
            0,
            2,
            GROUP_NAME,
            backend=self.backend,
            device=self.device,
            timeout_s=self.group_timeout,
        )
        done, _ = concurrent.futures.wait(
            [joined, group], timeout=self.group_timeout, return_when=concurrent.futures.FIRST_EXCEPTION
        )
        for future in done:
            future.result()  # the engine's refusal, if any, surfaces here
        if len(done) < 2:
            raise BenchmarkError(f"the weight-update group did not form in {self.group_timeout:.0f} s")
        self.group = group.result()
        self.sender = NcclSender(self.group)
        return {"init_s": time.perf_counter() - started}

    def _send(self, state: Tensors) -> tuple[Tensors, Timings]:
        """The trainer's side of one sync; returns once the last bucket has left this GPU."""
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            started = time.perf_counter()
            hf = to_hf(state, self.shape, self.convert)
            if self.device.type == "cuda":
                torch.cuda.current_stream().synchronize()  # nothing else is queued yet
            converted = time.perf_counter()
            self.sender.send(hf, self.specs)
            timings = {"sender_s": time.perf_counter() - converted}
        if self.convert:
            timings["convert_s"] = converted - started
        return hf, timings

    def sync(self, state: Tensors, version: str) -> tuple[Timings, Tensors]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # once, here: nothing is queued between syncs
        clock = Clock(self.device, sync_device=False)
        sending = self.pool.submit(self._send, state)
        self.pause_and_flush(clock)
        try:
            for i, spec in enumerate(self.specs):
                last = i == len(self.specs) - 1
                body = spec.body(GROUP_NAME, version if last else None)
                self.server.expect("POST", "/update_weights_from_distributed", body)
            clock.mark("transfer_s")
        finally:  # as the manager: the engine never stays paused
            self.resume(clock)
        hf, sender = sending.result(timeout=self.group_timeout)
        clock.mark("sender_wait_s")  # the trainer's side still running after continue (about 0)
        return {**clock.result(), **sender}, hf

    def pack_alone_s(self, hf: Tensors, reps: int = 3) -> float:
        """Packing every bucket without sending: how much of the sender's time is its own copies."""
        from rljob_runtime.sync.nccl import pack

        times = []
        for _ in range(reps):
            clock = Clock(self.device)
            for spec in self.specs:
                flat = pack([hf[n] for n in spec.names])
                del flat
            clock.mark("pack")
            times.append(clock.phases["pack"])
        return statistics.median(times)

    def close(self, graceful: bool = True) -> None:
        if self.group is not None and graceful:  # else a collective may be stuck: main exits hard
            self.server.expect("POST", "/destroy_weights_update_group", {"group_name": GROUP_NAME})
            self.group.close()
            self.group = None
        self.pool.shutdown(wait=False)


TRANSPORT_CLASSES: dict[str, type[Transport]] = {
    "ipc": IpcTransport,
    "nccl": NcclTransport,
    "tensors": TensorsTransport,
}


# ------------------------------------------------------------------------------- checks and figures


def compare_checksums(
    engine: dict[str, Any], producer: dict[str, tuple[int, int]], aliases: dict[str, str]
) -> list[str]:
    """Problems, empty when the engine's weights are the producer's: every sent tensor equal, and every
    engine tensor sent (``aliases``: engine names that are another tensor, e.g. a tied lm_head)."""
    problems = [f"{name}: not on the engine" for name in producer if name not in engine]
    for name, sums in engine.items():
        source = aliases.get(name, name)
        if source not in producer:
            problems.append(f"{name}: on the engine, never sent")
        elif tuple(sums) != tuple(producer[source]):
            problems.append(f"{name}: checksum {tuple(sums)} != producer's {tuple(producer[source])}")
    return problems


def verify(server: EngineServer, hf: Tensors, version: str, tied: bool) -> None:
    answer = server.expect("GET", "/weights_checksum")
    if answer.get("weight_version") != version:
        raise BenchmarkError(f"engine weight_version {answer.get('weight_version')!r}, expected {version!r}")
    aliases = {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}
    problems = compare_checksums(answer["checksums"], checksums(hf.items()), aliases)
    if problems:
        raise BenchmarkError(
            f"engine weights differ after sync {version}: {problems[:5]} ({len(problems)} in all)"
        )


def summarize(runs: list[Timings], size: int, floor_gbps: float, warmup: int = 1) -> dict[str, Any]:
    """Median of each timing over the runs after ``warmup``; GB/s and the floor from the median total."""
    timed = runs[warmup:]
    if not timed:
        raise ValueError(f"{len(runs)} run(s), none after {warmup} warm-up(s)")
    keys = list(dict.fromkeys(k for run in timed for k in run))
    out: dict[str, Any] = {k: statistics.median(run.get(k, 0.0) for run in timed) for k in keys}
    floor_s = size / (floor_gbps * 1e9)
    out.update(
        bytes=size,
        reps=len(timed),
        gb_per_s=size / out["total_s"] / 1e9,
        floor_gbps=floor_gbps,
        floor_s=floor_s,
        x_floor=out["total_s"] / floor_s,
        warmup_total_s=runs[0]["total_s"] if warmup else None,
    )
    return out


def format_table(results: list[dict[str, Any]]) -> str:
    """One row per model; phases in milliseconds ('-' where the transport has no such phase)."""
    phases = [p for p in PHASES if any(p in r for r in results)]
    head = ["model", "params", "GB", "buckets", *(p.removesuffix("_s") + "_ms" for p in phases)]
    head += ["GB/s", "floor_ms", "x_floor"]
    rows = [head]
    for r in results:
        row = [r["model"], f"{r['params'] / 1e9:.2f}B", f"{r['bytes'] / 1e9:.3f}", str(r["buckets"])]
        row += [f"{r[p] * 1e3:.1f}" if p in r else "-" for p in phases]
        row += [f"{r['gb_per_s']:.1f}", f"{r['floor_s'] * 1e3:.1f}", f"{r['x_floor']:.1f}"]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def target_lines(results: list[dict[str, Any]], target_gbps: float | None) -> list[str]:
    if target_gbps is None:
        return []
    return [
        f"{r['model']}: {r['gb_per_s']:.1f} GB/s vs target {target_gbps:.0f}: "
        + ("met" if r["gb_per_s"] >= target_gbps else "MISSED")
        for r in results
        if r["model"] == TARGET_MODEL
    ]


# ------------------------------------------------------------------------------------------ a model


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()


def measure(
    model: str, transport: Transport, server: EngineServer, state: Tensors, reps: int, tied: bool
) -> tuple[list[Timings], Tensors]:
    """One warm-up and ``reps`` timed syncs, each of new values and checked bit-exact; the timings and
    the last sync's HF tensors."""
    runs = []
    for rep in range(reps + 1):
        randomize_(state, seed=rep + 1)
        version = f"bench-{rep}"
        timings, hf = transport.sync(state, version)
        verify(server, hf, version, tied)
        runs.append(timings)
        # every phase on each line: a run cut short by its time limit still shows where the time went
        phases = " ".join(
            f"{k[:-2]} {v * 1e3:.1f}" for k, v in timings.items() if k.endswith("_s") and k != "total_s"
        )
        print(
            f"{model}: sync {rep} {timings['total_s'] * 1e3:.1f} ms ({phases}), checksums equal", flush=True
        )
    return runs, hf


def run_model(model: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    producer_device, engine_device = devices(args)
    config = qwen3_config(model)
    shape = model_shape(config)
    tied = shape.tied_embeddings
    weights = random_hf_state(shape, dtype=torch.bfloat16, seed=DIR_SEED, device=str(producer_device))
    result: dict[str, Any] = {"model": model, "transport": args.transport, "convert": not args.no_convert}
    with model_dir(model, config, weights, args.model_root) as directory:
        if args.no_convert:
            state = weights
        else:
            state = hf_to_megatron(weights, shape, padded_vocab_size(shape.vocab_size, tp=1))
        del weights
        log_path = log_dir / f"server-{args.transport}-{model}.log"
        print(f"{model}: starting the engine on {engine_device} (log {log_path})", flush=True)
        with EngineServer(
            directory, engine_device, log_path, args.server_timeout, args.request_timeout
        ) as server:
            transport = TRANSPORT_CLASSES[args.transport](server, shape, producer_device, args)
            finished = False
            try:
                result.update(transport.setup(to_hf(state, shape, transport.convert)))
                runs, hf = measure(model, transport, server, state, args.reps, tied)
                if isinstance(transport, NcclTransport):
                    result["pack_alone_s"] = transport.pack_alone_s(hf)
                result.update(summarize(runs, nbytes(hf), args.floor_gbps))
                result.update(
                    params=sum(t.numel() for t in hf.values()),
                    tensors=len(hf),
                    buckets=transport.buckets,
                    server_start_s=server.start_s,
                    checksums_equal=True,
                    runs=runs,
                )
                del hf
                finished = True
            finally:
                transport.close(graceful=finished)
    del state
    free_memory()
    return result


def environment(producer: torch.device) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if producer.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(producer)
        env["gpus"] = torch.cuda.device_count()
        env["d2d_copy_gb_per_s"] = copy_gb_per_s()
        free_memory()
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    producer_device, engine_device = devices(args)
    if producer_device.type == "cuda":
        torch.cuda.set_device(producer_device)
    # NVLink multicast gains nothing for a two-rank broadcast, and shared GPU hosts want it off; the
    # engine server inherits this environment
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="weight-sync-path-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = environment(producer_device)
    print(
        f"transport {args.transport}: producer {producer_device}, engine {engine_device}; "
        f"floor {args.floor_gbps:.0f} GB/s; "
        + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in env.items()),
        flush=True,
    )
    results: list[dict[str, Any]] = []
    error = None
    try:
        for model in args.models:
            results.append(run_model(model, args, log_dir))
    except Exception as exc:  # reported (and written to --json) with what was measured so far
        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"
    if results:
        print(format_table(results))
        for line in target_lines(results, args.target_gbps):
            print(line)
    if args.json:
        summary = {k: v for k, v in vars(args).items() if k not in ("json", "model_root", "log_dir")}
        out = {"args": summary, "environment": env, "results": results, "error": error}
        args.json.write_text(json.dumps(out, indent=2, default=str))
    if error is not None:
        print(f"FAILED: {error}", file=sys.stderr, flush=True)
        if args.transport == "nccl":
            sys.stdout.flush()
            os._exit(1)  # a collective may still be queued: exiting normally could wait on it forever
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
