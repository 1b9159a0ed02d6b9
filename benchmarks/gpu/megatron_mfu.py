"""Training throughput and MFU of the megatron backend's model on one GPU: a Megatron GPTModel built by
``trainer/megatron/model.py`` (local layer spec: no TransformerEngine, no flash attention), random
Qwen3-style weights, bf16 params with fp32 main params / grads, Megatron DDP + distributed Adam,
sequence length 4096, micro-batch 1, next-token cross-entropy on random tokens.

    python3 benchmarks/gpu/megatron_mfu.py --models 1b,4b --seq 4096 --json /tmp/mfu.json

Per step: forward + backward + optimizer step, timed with a synchronize around ``--steps`` steps
after ``--warmup``. MFU = model FLOPs per token x tokens/s / peak, model FLOPs per token = 6 N +
12 L s d_attn (N: parameters doing matmuls, i.e. the layers + the LM head; the attention term
counts the full s x s products, as PaLM's appendix B does; recomputed work is not counted).
``--peak-tflops`` defaults to 989 (H100/H200 SXM dense bf16). The attention of the local spec
materialises the s x s scores, so ``--recompute selective`` (core attention recomputed in backward,
Megatron's option) keeps the activations small. Several models run one process each (fresh memory).
Results and what limits them: docs/BENCHMARKS.md (Megatron section).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
try:
    import rljob_runtime  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path[:0] = [str(REPO / "runtime"), str(REPO / "api")]

from rljob_runtime.trainer.megatron import model_shape, validate_parallelism  # noqa: E402
from rljob_runtime.trainer.megatron.model import build_gpt_model, causal_mask, init_model_parallel  # noqa: E402
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
    if dist.is_initialized():
        return
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
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


def run_model(
    name: str, seq: int, steps: int, warmup: int, recompute: str | None, peak: float
) -> dict[str, Any]:
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    shape = model_shape(MODELS[name])
    par = validate_parallelism(shape, gpus=1)
    init_model_parallel(par, seed=0)
    torch.cuda.reset_peak_memory_stats()
    model = build_gpt_model(shape, par, dtype=torch.bfloat16, recompute=recompute)  # type: ignore[arg-type]
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    model = DistributedDataParallel(config=model.config, ddp_config=ddp, module=model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-5,
            bf16=True,
            params_dtype=torch.bfloat16,
            clip_grad=1.0,
            use_distributed_optimizer=True,
        ),
        [model],
        use_gloo_process_groups=False,
    )
    config = model.module.config
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = model.no_sync
    vocab = shape.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    mask = causal_mask(seq, "cuda")
    positions = torch.arange(seq, device="cuda")[None]

    def forward_step(data: Any, chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        ids = torch.randint(0, vocab, (1, seq + 1), device="cuda", generator=gen)
        losses = chunk(ids[:, :-1], positions, mask, labels=ids[:, 1:])  # [1, s] per-token CE

        def loss_fn(out: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            loss = out.float().mean()
            return loss, {"loss": loss.detach()}

        return losses, loss_fn

    def step() -> float:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        out = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([None]),
            model=[model],
            num_microbatches=1,
            seq_length=seq,
            micro_batch_size=1,
            forward_only=False,
        )
        optimizer.step()
        return float(out[0]["loss"])

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    losses = [step() for _ in range(steps)]
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / steps
    n_matmul, n_total = matmul_params(shape)
    flops_per_token = 6 * n_matmul + 12 * shape.num_layers * seq * shape.q_size
    tokens_per_s = seq / seconds
    result = {
        "model": name,
        "params": n_total,
        "matmul_params": n_matmul,
        "padded_vocab": padded_vocab_size(vocab, 1),
        "seq": seq,
        "recompute": recompute,
        "step_s": round(seconds, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops": round(flops_per_token * tokens_per_s / 1e12, 1),
        "mfu": round(flops_per_token * tokens_per_s / (peak * 1e12), 4),
        "attention_share_of_flops": round(12 * shape.num_layers * seq * shape.q_size / flops_per_token, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="1b,4b")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--recompute", default="selective", choices=["none", "selective", "full"])
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    names = args.models.split(",")
    if len(names) > 1:  # one process per model: nothing of the last model's memory is left over
        results = []
        for name in names:
            part = Path(args.json or "/tmp/megatron_mfu.json").with_suffix(f".{name}.json")
            argv = ["--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup)]
            argv += ["--recompute", args.recompute, "--peak-tflops", str(args.peak_tflops)]
            subprocess.run(
                [sys.executable, __file__, *argv, "--models", name, "--json", str(part)], check=False
            )
            results.extend(
                json.loads(part.read_text()) if part.exists() else [{"model": name, "error": "crashed"}]
            )
    else:
        init_single_gpu()
        recompute = None if args.recompute == "none" else args.recompute
        try:
            results = [run_model(names[0], args.seq, args.steps, args.warmup, recompute, args.peak_tflops)]
        except torch.OutOfMemoryError as err:
            results = [{"model": names[0], "error": f"out of memory: {str(err).splitlines()[0]}"}]
        print(json.dumps(results[-1]), flush=True)
        dist.destroy_process_group()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, peak {args.peak_tflops} TFLOP/s bf16 dense")
    print("| model | params | seq | recompute | step s | tokens/s | model TFLOP/s | MFU | peak mem GiB |")
    for r in results:
        if "error" in r:
            print(f"| {r['model']} | {r['error']} |")
            continue
        print(
            f"| {r['model']} | {r['params'] / 1e9:.2f}B | {r['seq']} | {r['recompute']} | {r['step_s']} | "
            f"{r['tokens_per_s']} | {r['model_tflops']} | {r['mfu']:.3f} | {r['peak_mem_gib']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
