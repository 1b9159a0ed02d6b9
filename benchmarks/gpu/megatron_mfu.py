"""Training throughput and MFU of the megatron backend's model on one GPU: a Megatron GPTModel built by
``trainer/megatron/model.py`` (local layer spec, no TransformerEngine; core attention through torch's
SDPA, ``--attention sdpa``, or megatron-core's DotProductAttention, ``--attention local``), random
Qwen3-style weights, bf16 params with fp32 main params / grads, Megatron DDP + distributed Adam,
sequence length 4096, micro-batch 1 (one sequence; ``--micro-batch-size``), next-token cross-entropy on
random tokens.

The model, DDP, optimizer and LM head are built as a job builds them: the options become an
RLTrainingJob spec (``mfu_spec.spec_document``: training.fusions, lmHead, recomputeActivations, megatronArgs,
offloadOptimizer, parallelism.tensor, microBatchSize) and the megatron backend's own
``model_options`` + ``build_policy`` build from it, so a figure is what a job with those fields gets
(recorded as ``spec_training``). ``--from-spec job.yaml`` takes those fields from a job's manifest
instead (its defaults included: unset fusions are all four, an unset lmHead is chunked).

    python3 benchmarks/gpu/megatron_mfu.py --models 1b --from-spec examples/manifests/grpo-job.yaml
    python3 benchmarks/gpu/megatron_mfu.py --models 1b --recompute none --json /tmp/mfu.json
    python3 benchmarks/gpu/megatron_mfu.py --models 1b --profile --json /tmp/mfu.json  # + kernel breakdown
    python3 benchmarks/gpu/megatron_mfu.py --models 1b --ce-fusion --grad-dtype bf16 --json /tmp/mfu.json
    python3 benchmarks/gpu/megatron_mfu.py --models 4b --grad-dtype bf16 --recompute full --memory-limit-gib 78
    python3 benchmarks/gpu/megatron_mfu.py --models 1b --attention local --recompute selective  # before
    python3 benchmarks/gpu/megatron_mfu.py --models 1b --fusions wgrad,norm,rope --json /tmp/mfu.json
    python3 benchmarks/gpu/megatron_mfu.py --models 4b --lm-head chunked --recompute full --recompute-layers 24

One optimizer step = ``--micro-batches`` N forward + backward passes of one sequence each (gradient
accumulation through Megatron's forward_backward_func, num_microbatches=N), then the optimizer step
(grad norm, clip, Adam, bf16 copy). ``--steps`` steps are timed after ``--warmup`` (which also covers
torch.compile of the fused SwiGLU, RMSNorm and RoPE), with a synchronize around them; CUDA events
split each step into forward + backward (with zeroing the grad buffers and Megatron's grad
finalisation) and the optimizer.

MFU = model FLOPs per token x tokens/s / peak, tokens/s counting all N x seq tokens of a step; model
FLOPs per token = 6 N + 12 L s d_attn (N: parameters doing matmuls, i.e. the layers + the LM head; the
attention term counts the full s x s products, as PaLM's appendix B does; recomputed work is not
counted). ``--peak-tflops`` defaults to 989 (H100/H200 SXM dense bf16). ``--recompute``: none;
selective (Megatron's core-attention recompute: needed by the local attention, which materialises the
s x s scores, and nearly useless with SDPA, which keeps O(s) per layer); full (every layer recomputed
in backward, which the 4b needs on an 80 GB GPU). ``sdpa_backend`` in the results is the kernel SDPA
picks for the model's attention shapes (``--sdpa-backend`` forces one). ``--swiglu unfused`` turns off
megatron-core's own fusion (torch.compile'd SwiGLU, on by default). Several models run one process each
(fresh memory). Results and what limits them: docs/BENCHMARKS.md (Megatron section).

Options beyond the defaults (each recorded in the result):

- ``--runs R``: R timed windows of ``--steps`` steps each, in the same process after the warm-up; the
  median window's figures are the result, every window's MFU is listed (``mfu_runs``), with the host
  CPU and its load (``host``): hosts of the same GPU differ (the 1b is host-bound).
- ``--offload-optimizer``: the runtime's ``training.offloadOptimizer`` (``optimizer_offload.py``): the
  fp32 main params and Adam moments in pinned host memory, streamed through the GPU in chunks at each
  optimizer step (how the 4b fits one 80 GB H100); its cost shows in the optimizer time.

- ``--fusions wgrad,norm,rope`` (any of them, comma-separated; default none): the plain-torch fusions
  of ``trainer/megatron/fusions.py`` on top of ``--swiglu``: "wgrad" accumulates each linear's weight
  gradient in its GEMM straight into DDP's fp32 main_grad (apex's gradient-accumulation fusion,
  without apex); "norm" is a torch.compile'd RMSNorm in every norm slot; "rope" a compiled RoPE.
  Recorded as ``fusions`` (SwiGLU included when fused).
- ``--no-fused-adam``: torch's AdamW as megatron-core creates it (foreach, with a temporary as large
  as the parameter shard) instead of the default ``fused=True`` the backend uses
  (``fusions.use_fused_adam``); recorded as ``fused_adam``.
- ``--ce-fusion``: the model config's ``cross_entropy_loss_fusion=True``,
  ``cross_entropy_fusion_impl="native"``: ``LanguageModule.compute_language_model_loss`` then calls
  megatron-core's ``fusions/fused_cross_entropy.py`` (the same vocab-parallel cross-entropy, its
  pieces torch.compile'd through ``megatron.core.jit.jit_fuser``; no TE or apex) instead of
  ``tensor_parallel.vocab_parallel_cross_entropy``. Set on the built model's config, which the loss
  reads at every call.
- ``--grad-dtype bf16``: ``DistributedDataParallelConfig(grad_reduce_in_fp32=False)``: the grad
  buffer (gradient accumulation over micro-batches and the reduce) in bf16 instead of fp32. The
  distributed optimizer still keeps fp32 main params and fp32 Adam state; at the optimizer step it
  copies each grad shard to fp32 (``shard_model_grad.float()``), a copy that lives until the next
  step's ``zero_grad``: less memory in forward + backward, more at the optimizer step.
- ``--memory-limit-gib G``: cap this process's GPU memory at G GiB
  (``torch.cuda.set_per_process_memory_fraction``): on a larger GPU, shows whether a configuration
  fits an 80 GB H100 (78 GiB usable). The 4b's bf16 params, fp32 grads, fp32 main params and Adam
  state take 72 GB before activations; megatron-core's CPU optimizer offload would relieve that but
  needs TransformerEngine (0.16.1 without it: "can't optimize a non-leaf Tensor" on an H100).
- ``--micro-batch-size B``: B sequences per forward + backward pass (a [B, seq] batch, as RL trainers
  pack several responses into one micro-batch): B times fewer kernel launches per token, for a host
  too slow to keep the GPU busy with one 4,096-token sequence at a time.
- ``--recompute-layers K`` (with ``--recompute full``): recompute the first K layers only and keep
  the others' activations (Megatron's "block" method); without it every layer is recomputed.
- ``--lm-head chunked`` (training.lmHead chunked): the model returns its final hidden states and the
  loss comes from ``trainer/megatron/lm_head.py``'s ``ChunkedHead`` (what the job's ``token_stats``
  calls): logits one chunk of tokens at a time (fp32, about 256 MiB), recomputed in backward, never
  the whole [tokens, vocab] tensor (1.2 GiB bf16 per 4,096 tokens at a 151,936 vocab, and several fp32
  copies in the cross-entropy); with the wgrad fusion the head's weight gradient goes straight into
  its fp32 main_grad. Excludes ``--ce-fusion``. MFU does not count the head's recomputed GEMM.
- ``--profile``: after the timed steps, one more step under ``torch.profiler`` (CPU + CUDA): the
  top 25 GPU kernels by total GPU time, GPU time by category (``profile_summary.py``), and
  the GPU idle fraction = 1 - GPU busy time / step wall time (launch overhead, host-side work).
  Stored under ``"profile"`` in the result; the timed figures do not include the profiled step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
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
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the sibling modules, and benchmarks/bench_cli.py

# Only the pure modules at import time (arguments and the profile helpers are unit-tested without
# megatron-core); attention.py and model.py, which import megatron-core, are imported where used.
from bench_cli import add_json, add_runs, add_steps_and_warmup, doc_parser  # noqa: E402
from mfu_report import fusions_text, grads_text, limit_text, table_lines  # noqa: E402, F401  (the table; tests use them here)
from mfu_spec import (  # noqa: E402  (the job's spec: pure, tested in tests/unit)
    EXTRA_FUSIONS,
    job_spec,
    parse_fusions,
    recompute_mode,
    spec_training_fields,
)
from profile_summary import format_summary, kernel_records, summarize_kernels  # noqa: E402

from rljob_runtime.trainer.megatron import model_shape, validate_parallelism  # noqa: E402
from rljob_runtime.trainer.megatron.parallel import padded_vocab_size  # noqa: E402
from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B  # noqa: E402

# Qwen3-style dense configs: "4b" is Qwen3-4B's shape; "1b" Qwen3-1.7B's width with 16 layers.
MODELS: dict[str, dict[str, Any]] = {
    "1b": {**QWEN3_0_6B, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 16},
    "4b": {
        **QWEN3_0_6B,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
    },
    # Qwen3-8B's shape (untied embeddings): trained at --tp 2 on two GPUs (torchrun).
    "8b": {
        **QWEN3_0_6B,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
}


def matmul_params(shape: Any) -> tuple[int, int]:
    """(N, all parameters): N counts the layers and the LM head (the input embedding is a lookup)."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    attn = h * shape.q_size + 2 * h * shape.kv_size + shape.q_size * h
    norms = 2 * h + (2 * shape.head_dim if shape.qk_norm else 0)
    layers = shape.num_layers * (attn + 3 * h * f + norms) + h
    head = shape.vocab_size * h
    total = layers + head * (1 if shape.tied_embeddings else 2)
    return layers + head, total


def init_single_gpu() -> None:
    """One NCCL rank, or every rank torchrun started (``--tp`` above 1: WORLD_SIZE in the environment)."""
    if dist.is_initialized():
        return
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(
            "nccl",
            timeout=datetime.timedelta(minutes=10),
            device_id=torch.device("cuda", torch.cuda.current_device()),
        )
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(minutes=10),
        device_id=torch.device("cuda", torch.cuda.current_device()),
    )


SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")


def sdpa_context(name: str) -> contextlib.AbstractContextManager[Any]:
    """``--sdpa-backend``: auto leaves SDPA's own choice; the others allow that kernel only."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return sdpa_kernel([backend])


def sdpa_choice(shape: Any, seq: int) -> str:
    """The kernel SDPA picks for one layer's attention as SdpaAttention calls it (bf16, permuted
    [s, b, heads, d] views, causal, GQA): flash / cuDNN, or a slow fallback worth knowing about."""
    try:
        from torch.nn.attention import SDPBackend

        from rljob_runtime.trainer.megatron.attention import native_gqa

        def heads(n: int) -> torch.Tensor:
            t = torch.empty(seq, 1, n, shape.head_dim, device="cuda", dtype=torch.bfloat16)
            return t.permute(1, 2, 0, 3).requires_grad_()

        q, kv = heads(shape.num_heads), heads(shape.num_kv_heads)
        gqa = shape.num_kv_heads != shape.num_heads and native_gqa(q)
        if shape.num_kv_heads != shape.num_heads and not gqa:
            kv = kv.repeat_interleave(shape.num_heads // shape.num_kv_heads, dim=1)
        choose: Any = torch._fused_sdp_choice  # type: ignore[attr-defined]  # private, diagnostics only
        choice = choose(q, kv, kv, is_causal=True, enable_gqa=gqa)
        return SDPBackend(choice).name.lower()
    except Exception as err:  # diagnostics only: a private torch API
        return f"unknown ({type(err).__name__})"


PROFILE_TOP = 25  # kernels listed by --profile
GRAD_DTYPES = ("fp32", "bf16")
LM_HEADS = ("full", "chunked")


def profile_step(step: Callable[[], float], reference_step_s: float) -> dict[str, Any]:
    """``--profile``: one more ``step()`` under torch.profiler (CPU + CUDA activities), summarised by
    ``profile_summary.summarize_kernels``; wall time from a synchronize before it to one after it."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - started) * 1e3
    records = kernel_records(prof.events())
    summary = summarize_kernels(records, wall_ms, top=PROFILE_TOP, reference_step_ms=reference_step_s * 1e3)
    if not records:
        summary["warning"] = "no CUDA kernels in the trace (is CUPTI available?)"
    return summary


def first_line(err: BaseException) -> str:
    lines = str(err).splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def run_model(
    name: str,
    spec: Any,
    seq: int,
    steps: int,
    warmup: int,
    peak: float,
    attention: str,
    micro_batches: int,
    sdpa_backend: str,
    *,
    ce_fusion: bool = False,
    grad_dtype: str = "fp32",
    memory_limit_gib: float | None = None,
    profile: bool = False,
    fused_adam: bool = True,
    runs: int = 1,
) -> dict[str, Any]:
    """Time ``name``'s model as a job with ``spec`` trains it: built by the megatron backend's own
    ``model_options`` + ``build_policy`` (fusions, LM head, recompute, megatronArgs, offloadOptimizer,
    the tensor size and micro-batch size all from ``spec.training``). ``attention``, ``grad_dtype``,
    ``fused_adam`` and ``ce_fusion`` are the comparisons the spec has no field for."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from rljob_runtime.trainer.megatron.model import causal_mask, init_model_parallel, unwrap
    from rljob_runtime.trainer.megatron.policy import build_policy, model_options

    if grad_dtype not in GRAD_DTYPES:
        raise ValueError(f"grad_dtype must be one of {GRAD_DTYPES}, got {grad_dtype!r}")
    training = spec.training
    tp, micro_batch_size = training.parallelism.tensor, training.micro_batch_size
    options = model_options(spec)
    if ce_fusion and options.chunked_head:
        raise ValueError("the chunked LM head computes its own cross-entropy: drop --ce-fusion")
    shape = model_shape(MODELS[name])
    world = dist.get_world_size()
    par = validate_parallelism(shape, tp=tp, gpus=world)
    init_model_parallel(par, seed=0)
    if memory_limit_gib is not None:  # allocations past it raise OutOfMemoryError, as on a smaller GPU
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_limit_gib * 2**30 / total))
    torch.cuda.reset_peak_memory_stats()
    # The job's path: the same builder MegatronTrainerRank._build calls, with random weights.
    policy = build_policy(
        spec,
        options,
        shape,
        par,
        dtype=torch.bfloat16,
        device=torch.device("cuda", torch.cuda.current_device()),
        attention=attention,  # type: ignore[arg-type]
        grad_reduce_in_fp32=grad_dtype == "fp32",
        fused_adam=fused_adam,
    )
    model, optimizer, offload, head = policy.model, policy.optimizer, policy.offload, policy.head
    if ce_fusion:
        # TransformerConfig fields (from ModelParallelConfig) that nothing checks at build time:
        # LanguageModule.compute_language_model_loss reads them at every call, so setting them on
        # the built model's config (the one object GPTModel and the DDP wrapper share) is enough.
        unwrap(model).config.cross_entropy_loss_fusion = True
        unwrap(model).config.cross_entropy_fusion_impl = "native"
    vocab = shape.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    mask = causal_mask(seq, "cuda")
    positions = torch.arange(seq, device="cuda")[None].expand(micro_batch_size, seq)

    def forward_step(data: Any, chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        ids = torch.randint(0, vocab, (micro_batch_size, seq + 1), device="cuda", generator=gen)
        if head is not None:  # the chunked LM head, as the job's token_stats calls it
            hidden = chunk(ids[:, :-1], positions, mask)  # [b, s, h]: the output layer is the identity
            logp, _ = head(hidden, ids[:, 1:], vocab_size=vocab)
            losses = -logp  # [b, s] per-token CE
        else:
            losses = chunk(ids[:, :-1], positions, mask, labels=ids[:, 1:])  # [b, s] per-token CE

        def loss_fn(out: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            loss = out.float().mean()
            # A copy: Megatron divides the returned loss by num_microbatches in place.
            return loss, {"loss": loss.detach().clone()}

        return losses, loss_fn

    # Per step: (start, after forward + backward, after the optimizer) CUDA events.
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]] = []

    def step() -> float:
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        out = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=None,  # forward_step makes its own tokens
            model=[model],
            num_microbatches=micro_batches,
            seq_length=seq,
            micro_batch_size=micro_batch_size,
            forward_only=False,
        )
        mid.record()
        optimizer.step()
        end.record()
        marks.append((start, mid, end))
        return sum(float(o["loss"]) for o in out) / len(out)

    profiled: dict[str, Any] | None = None
    with sdpa_context(sdpa_backend):
        chosen = sdpa_choice(shape, seq) if attention == "sdpa" else "n/a (local attention)"
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        windows: list[tuple[float, list[Any]]] = []  # per run: seconds per step, its CUDA events
        losses: list[float] = []
        for _ in range(runs):
            marks.clear()
            started = time.perf_counter()
            losses += [step() for _ in range(steps)]
            torch.cuda.synchronize()
            windows.append(((time.perf_counter() - started) / steps, list(marks)))
        # The median run's figures (by step time): one slow window does not set the result.
        seconds, timed = sorted(windows, key=lambda w: w[0])[len(windows) // 2]
        if profile:
            try:
                profiled = profile_step(step, seconds)
                start, mid, end = marks[-1]
                profiled["fwd_bwd_ms"] = round(start.elapsed_time(mid), 3)
                profiled["optimizer_ms"] = round(mid.elapsed_time(end), 3)
            except Exception as err:  # diagnostics only: keep the timed figures
                profiled = {"error": first_line(err)}
    fwd_bwd = sum(a.elapsed_time(b) for a, b, _ in timed) / 1e3 / steps
    optim = sum(b.elapsed_time(c) for _, b, c in timed) / 1e3 / steps
    n_matmul, n_total = matmul_params(shape)
    attn_flops = 12 * shape.num_layers * seq * shape.q_size
    flops_per_token = 6 * n_matmul + attn_flops
    # Every data-parallel replica trains its own micro-batches; MFU is per GPU (peak x GPUs).
    step_tokens = micro_batches * micro_batch_size * seq * par.dp
    tokens_per_s = step_tokens / seconds
    result: dict[str, Any] = {
        "model": name,
        "params": n_total,
        "matmul_params": n_matmul,
        "padded_vocab": padded_vocab_size(vocab, tp),
        "tp": tp,
        "gpus": world,
        "seq": seq,
        "micro_batches": micro_batches,
        "micro_batch_size": micro_batch_size,
        "attention": attention,
        "sdpa_backend": chosen,
        "swiglu": "fused" if "swiglu" in options.fusions else "unfused",
        "fusions": sorted(options.fusions),
        "fused_adam": fused_adam,
        "recompute": recompute_mode(spec),
        "recompute_layers": options.megatron.transformer.get("recompute_num_layers")
        if options.megatron.transformer.get("recompute_method") == "block"
        else None,
        "lm_head": "chunked" if options.chunked_head else "full",
        "ce_fusion": ce_fusion,
        "grad_dtype": grad_dtype,
        "memory_limit_gib": memory_limit_gib,
        "offload_optimizer": training.offload_optimizer,
        # what a job sets to train this way: the spec's training fields the build read
        "spec_training": spec_training_fields(spec),
        "runs": runs,
        "step_s_runs": [round(w[0], 4) for w in windows],
        "mfu_runs": [round(flops_per_token * step_tokens / w[0] / (peak * world * 1e12), 4) for w in windows],
        "host": host_info(),
        "step_s": round(seconds, 4),
        "fwd_bwd_s": round(fwd_bwd, 4),
        "optimizer_s": round(optim, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops": round(flops_per_token * tokens_per_s / world / 1e12, 1),  # per GPU
        "mfu": round(flops_per_token * tokens_per_s / (peak * world * 1e12), 4),
        "attention_share_of_flops": round(attn_flops / flops_per_token, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 1),
        # ru_maxrss is in KiB on Linux; pinned host buffers count (they are touched).
        "peak_host_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1),
        "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
    }
    # What Megatron built under its DistributedOptimizer: AdamW (torch's, without TE / apex).
    try:
        result["inner_optimizer"] = type(optimizer.optimizer).__name__
    except Exception as err:  # diagnostics only (ChainedOptimizer.optimizer asserts a single one)
        result["inner_optimizer"] = f"unknown ({type(err).__name__})"
    if profiled is not None:
        result["profile"] = profiled
    if offload is not None:
        result["offloaded_state_gib"] = round(offload.host_bytes() / 2**30, 1)
    return result


def host_info() -> dict[str, Any]:
    """The host CPU (model, cores) and its load: the 1b's step is host-bound on slow hosts."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "load1": round(load[0], 2),
        "gpu": torch.cuda.get_device_name(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", default="1b,4b")
    parser.add_argument("--seq", type=int, default=4096)
    add_steps_and_warmup(parser, steps=5, warmup=2)
    parser.add_argument("--micro-batches", type=int, default=4, help="sequences per optimizer step")
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "local"])
    parser.add_argument("--sdpa-backend", default="auto", choices=SDPA_BACKENDS)
    parser.add_argument("--swiglu", default="fused", choices=["fused", "unfused"])
    parser.add_argument(
        "--fusions",
        type=parse_fusions,
        default=(),
        help=f"plain-torch fusions besides SwiGLU, comma-separated from {','.join(EXTRA_FUSIONS)}",
    )
    parser.add_argument(
        "--fused-adam",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch AdamW with fused=True (the backend's choice); --no-fused-adam: foreach",
    )
    parser.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    parser.add_argument(
        "--recompute-layers",
        type=int,
        default=None,
        help="with --recompute full: recompute the first K layers only (default: all)",
    )
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument(
        "--lm-head",
        default="full",
        choices=LM_HEADS,
        help="full: Megatron's output layer + cross-entropy; chunked: trainer/megatron/lm_head.py",
    )
    parser.add_argument(
        "--ce-fusion",
        action="store_true",
        help="megatron-core's native fused cross-entropy (cross_entropy_loss_fusion, impl 'native')",
    )
    parser.add_argument(
        "--grad-dtype",
        default="fp32",
        choices=GRAD_DTYPES,
        help="DDP grad buffer dtype (fp32: grad_reduce_in_fp32); main params and Adam stay fp32",
    )
    parser.add_argument(
        "--memory-limit-gib",
        type=float,
        default=None,
        help="cap this process's GPU memory (e.g. 78: does it fit an 80 GB H100?)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile one more step: top GPU kernels, time by category, GPU idle fraction",
    )
    parser.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="training.offloadOptimizer: fp32 main params + Adam moments in pinned host memory, streamed",
    )
    add_runs(parser, 1, help="timed windows of --steps steps each; the median one is reported")
    parser.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor parallel size: run under torchrun --nproc-per-node N (one model)",
    )
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument(
        "--from-spec",
        type=Path,
        default=None,
        help="an RLTrainingJob manifest (or bare spec): its training fields (fusions, lmHead, recompute, "
        "megatronArgs, offloadOptimizer, parallelism.tensor, microBatchSize) instead of the flags that set them",
    )
    add_json(parser)
    args = parser.parse_args(argv)
    if args.micro_batches < 1:
        parser.error("--micro-batches must be >= 1")
    if args.micro_batch_size < 1:
        parser.error("--micro-batch-size must be >= 1")
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    if args.tp < 1 or (args.tp > 1 and "," in args.models):
        parser.error("--tp must be >= 1, and with --tp above 1 one model per torchrun")
    if args.recompute_layers is not None and (args.recompute != "full" or args.recompute_layers < 1):
        parser.error("--recompute-layers needs --recompute full and must be >= 1")
    if args.lm_head == "chunked" and args.ce_fusion:
        parser.error("--lm-head chunked computes its own cross-entropy: drop --ce-fusion")
    if args.memory_limit_gib is not None and args.memory_limit_gib <= 0:
        parser.error("--memory-limit-gib must be positive")
    return args


def child_argv(args: argparse.Namespace) -> list[str]:
    """Every option but --models and --json, for the one-process-per-model runs."""
    argv = ["--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    argv += ["--recompute", args.recompute, "--peak-tflops", str(args.peak_tflops)]
    argv += ["--micro-batches", str(args.micro_batches), "--attention", args.attention]
    argv += ["--sdpa-backend", args.sdpa_backend, "--swiglu", args.swiglu]
    argv += ["--grad-dtype", args.grad_dtype, "--fusions", ",".join(args.fusions) or "none"]
    argv.append("--fused-adam" if args.fused_adam else "--no-fused-adam")
    argv += ["--micro-batch-size", str(args.micro_batch_size), "--lm-head", args.lm_head]
    argv += ["--runs", str(args.runs), "--tp", str(args.tp)]
    if args.recompute_layers is not None:
        argv += ["--recompute-layers", str(args.recompute_layers)]
    if args.memory_limit_gib is not None:
        argv += ["--memory-limit-gib", str(args.memory_limit_gib)]
    if args.from_spec is not None:
        argv += ["--from-spec", str(args.from_spec)]
    for flag in ("ce_fusion", "profile", "offload_optimizer"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    return argv


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.models.split(",")
    leader = int(os.environ.get("RANK", "0")) == 0
    if len(names) > 1:  # one process per model: nothing of the last model's memory is left over
        results = []
        for name in names:
            part = (args.json or Path("/tmp/megatron_mfu.json")).with_suffix(f".{name}.json")
            part.unlink(missing_ok=True)  # a crashed run must not report an older file
            subprocess.run(
                [sys.executable, __file__, *child_argv(args), "--models", name, "--json", str(part)],
                check=False,
            )
            results.extend(
                json.loads(part.read_text()) if part.exists() else [{"model": name, "error": "crashed"}]
            )
    else:
        init_single_gpu()
        spec = job_spec(args, dist.get_world_size())
        try:
            results = [
                run_model(
                    names[0],
                    spec,
                    args.seq,
                    args.steps,
                    args.warmup,
                    args.peak_tflops,
                    args.attention,
                    args.micro_batches,
                    args.sdpa_backend,
                    ce_fusion=args.ce_fusion,
                    grad_dtype=args.grad_dtype,
                    memory_limit_gib=args.memory_limit_gib,
                    profile=args.profile,
                    fused_adam=args.fused_adam,
                    runs=args.runs,
                )
            ]
        except torch.OutOfMemoryError as err:
            results = [{"model": names[0], "error": f"out of memory: {str(err).splitlines()[0]}"}]
        except RuntimeError as err:  # e.g. no kernel for a forced --sdpa-backend
            results = [{"model": names[0], "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}]
        prof = results[-1].get("profile")
        if isinstance(prof, dict) and "top_kernels" in prof:
            print("\n".join(["", f"{names[0]}: one profiled step", *format_summary(prof)]), flush=True)
        if leader:
            print(json.dumps(results[-1]), flush=True)
        dist.destroy_process_group()
    if not leader:  # torchrun's other ranks: rank 0 reports
        return 0
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, peak {args.peak_tflops} TFLOP/s bf16 dense")
    print("\n".join(table_lines(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
