"""The plain-torch fusions (``trainer/megatron/fusions.py``) on a GPU, where they are meant to run:
a bf16 Qwen3-style model with wgrad + norm + rope (and megatron-core's SwiGLU) against the same
weights unfused, under Megatron DDP with two micro-batches; the wgrad stand-in must take CUDA's
fp32-output addmm (no fallback), and fused Adam under the distributed optimizer must step as the
foreach one. The CPU twin of these checks is tests/unit/test_megatron_fusions.py."""

from __future__ import annotations

import socket
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from rljob_runtime.trainer.megatron import fusions as fz
from rljob_runtime.trainer.megatron import model_shape, validate_parallelism
from rljob_runtime.trainer.megatron.model import (
    build_gpt_model,
    forward_logits,
    init_model_parallel,
    load_hf_weights,
)
from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B, random_hf_state

CONFIG = {**QWEN3_0_6B, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4}
CONFIG.update(num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096)


@pytest.fixture(scope="module")
def cuda_world() -> Iterator[None]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        fz.uninstall_rope_fusion()
        fz.uninstall_wgrad_fusion()


def _ddp(
    fusions: tuple[str, ...], dtype: torch.dtype = torch.bfloat16
) -> tuple[DistributedDataParallel, Any, Any]:
    shape = model_shape(CONFIG)
    par = validate_parallelism(shape, gpus=1)
    init_model_parallel(par)
    model = build_gpt_model(shape, par, dtype=dtype, fusions=fusions)
    load_hf_weights(model, random_hf_state(shape, seed=11), shape, par)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    ddp = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-3,
            bf16=dtype == torch.bfloat16,
            use_distributed_optimizer=True,
            clip_grad=1.0,
        ),
        [ddp],
        use_gloo_process_groups=False,
    )
    return ddp, shape, optimizer


def _micro_batches(ddp: DistributedDataParallel, shape: Any) -> list[torch.Tensor]:
    ddp.zero_grad_buffer()
    gen = torch.Generator(device="cuda").manual_seed(5)
    logits = []
    for length in (256, 192):
        ids = torch.randint(0, shape.vocab_size, (2, length), generator=gen, device="cuda")
        out = forward_logits(ddp, ids, shape)
        out.float().logsumexp(-1).mean().backward()
        logits.append(out.detach().float())
    return logits


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _run(fusions: tuple[str, ...], dtype: torch.dtype) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    # (each _ddp call re-creates megatron's groups: finish with one model before the next)
    ddp, shape, _ = _ddp(fusions, dtype)
    logits = _micro_batches(ddp, shape)
    for name, param in ddp.module.named_parameters():
        assert param.grad is None, name  # everything went to main_grad (DDP's hook or the wgrad GEMM)
    return logits, {n: p.main_grad.clone() for n, p in ddp.module.named_parameters()}


def test_fused_model_is_as_close_to_fp32_as_the_unfused_one(cuda_world: None) -> None:
    """bf16 differs from fp32 either way; the fusions round differently (fp32 norm math rounded once,
    the weight gradient not rounded to bf16 before the fp32 accumulation), so each bf16 model is
    judged by its distance to the fp32 model, and the fused one may not be meaningfully farther."""
    truth_logits, truth_grads = _run((), torch.float32)
    ref_logits, ref_grads = _run(("swiglu",), torch.bfloat16)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="addmm with out_dtype")  # the fallback: fail instead
        fused_logits, fused_grads = _run(("swiglu", "wgrad", "norm", "rope"), torch.bfloat16)
    assert fz._MIXED_ADDMM["ok"], "torch refused addmm(out_dtype=float32) on CUDA"
    for truth, ref, fused in zip(truth_logits, ref_logits, fused_logits, strict=True):
        assert _rel(fused, truth) <= 1.25 * _rel(ref, truth) + 1e-3
    worse = {
        name: (_rel(fused_grads[name], truth), _rel(ref_grads[name], truth))
        for name, truth in truth_grads.items()
        if _rel(fused_grads[name], truth) > 1.25 * _rel(ref_grads[name], truth) + 1e-3
    }
    assert not worse, worse


def test_fused_adam_steps_like_foreach_under_the_distributed_optimizer(cuda_world: None) -> None:
    results = []
    for fused_adam in (False, True):
        ddp, shape, optimizer = _ddp(("swiglu",))
        if fused_adam:
            assert fz.use_fused_adam(optimizer)
        for _ in range(2):
            _micro_batches(ddp, shape)
            ok, _, _ = optimizer.step()
            assert ok
        results.append({n: p.detach().float().clone() for n, p in ddp.module.named_parameters()})
    foreach, fused = results
    for name, value in foreach.items():
        assert _rel(fused[name], value) < 1e-3, name
