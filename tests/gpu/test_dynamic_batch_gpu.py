"""training.dynamicBatch on GPU (megatron backend, bf16, one GPU): packed micro-batches run FlashAttention's
varlen kernel (``torch.nn.attention.varlen.varlen_attn`` through ``SdpaAttention``) and megatron-core's
thd RoPE, and must give the padded micro-batches' log-probs, loss and gradients within bf16 tolerance,
with the plain RoPE and with the compiled one (``fusions`` "rope"). The CPU tests
(tests/unit/test_dynamic_batch_megatron.py) hold the same equalities exactly in float32, at TP2 / PP2.

    pytest tests/gpu/test_dynamic_batch_gpu.py -q
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.data.sample import Sample
from rljob_runtime.trainer.base import TrainBatch, build_batch
from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B, random_hf_state, with_layers

CONFIG = with_layers(QWEN3_0_6B, 4, vocab_size=32003)
# (prompt, response) lengths: most short, two long, one empty response; 16 rows, one global batch.
LENGTHS = [(40, 60), (900, 1100), (20, 5), (100, 0), (64, 300), (30, 30), (500, 1500), (12, 40)] * 2
BUDGET = 4096


def write_model(dest: Path) -> Path:
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(CONFIG))
    save_file(random_hf_state(model_shape(CONFIG), seed=5), str(dest / "model.safetensors"))
    return dest


def make_spec(model_dir: Path, dynamic: bool) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model_dir), "dtype": "bfloat16"},
            "data": {"path": "/unused.jsonl", "maxPromptLength": 1024},
            "algorithm": {"useKLLoss": True, "klLossCoef": 0.01, "lossReduction": "token"},
            "rollout": {"engine": "hf", "batchSize": 4, "nSamplesPerPrompt": 4, "maxResponseLen": 2048},
            "training": {
                "backend": "megatron",
                "globalBatchSize": 16,
                "microBatchSize": 1 if dynamic else 2,  # dynamic: the token budget sizes them
                "dynamicBatch": {"enabled": dynamic, "maxTokensPerGpu": BUDGET},
                "optimizer": {"lr": 1e-4, "clipGrad": 0.0},
            },
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )


def samples() -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i, (p, r) in enumerate(LENGTHS):
        response = torch.randint(0, CONFIG["vocab_size"], (r,), generator=gen).tolist()
        out.append(
            Sample(
                index=i,
                prompt_ids=torch.randint(0, CONFIG["vocab_size"], (p,), generator=gen).tolist(),
                response_ids=response,
                loss_mask=[1] * r,
            )
        )
    return out


def one_step(rank: Any, spec: RLTrainingJobSpec, batch: TrainBatch) -> dict[str, Any]:
    """logprobs and one optimizer step whose update is skipped (the rank then runs the other spec from
    the same weights); the fp32 main grads it would have stepped with."""
    rank.spec = spec
    grads: dict[str, torch.Tensor] = {}

    def record() -> tuple[bool, float, None]:
        for name, p in rank.model.module.named_parameters():
            grads[name] = p.main_grad.detach().float().cpu()
        return True, 0.0, None

    rank.optimizer.step = record
    lp = rank.logprobs(batch)
    adv = torch.linspace(-1.0, 1.0, batch.size)[:, None] * batch.loss_mask
    metrics = rank.train(batch, adv, lp.logp, lp.ref_logp)
    return {"lp": lp, "metrics": metrics, "grads": grads}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("qwen3-dyn") / "model")


@pytest.fixture(scope="module")
def port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_varlen_kernel_equals_per_sequence_sdpa() -> None:
    from rljob_runtime.trainer.megatron.attention import varlen_causal

    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [7, 300, 1, 1024, 65]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    t, heads, groups, hn = sum(lengths), 16, 8, 128

    def rand(h: int) -> torch.Tensor:
        return torch.randn(t, h, hn, generator=gen, device="cuda", dtype=torch.bfloat16)

    q, k, v = rand(heads), rand(groups), rand(groups)
    scale = 1.0 / math.sqrt(hn)
    out = varlen_causal(q, k, v, cu, max(lengths), scale)
    assert out is not None, "varlen_attn did not run on CUDA bf16 (the packed path fell back to the loop)"
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1)[None] for x in (q, k, v))
        ks, vs = ks.repeat_interleave(heads // groups, 1), vs.repeat_interleave(heads // groups, 1)
        want = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        torch.testing.assert_close(out[start:end], want[0].transpose(0, 1), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fusions", [(), ("rope",)], ids=["plain-rope", "fused-rope"])
def test_packed_equals_padded_in_bf16(model_dir: Path, port: int, fusions: tuple[str, ...]) -> None:
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    batch = build_batch(samples())
    padded_spec, packed_spec = make_spec(model_dir, False), make_spec(model_dir, True)
    rank = MegatronTrainerRank(padded_spec, str(model_dir), fusions=fusions)
    rank.init_process_group("127.0.0.1", port)
    padded = one_step(rank, padded_spec, batch)
    packed = one_step(rank, packed_spec, batch)
    rank.spec = packed_spec
    (step,) = rank._plan(batch)
    assert 1 < len(step) < batch.size  # packed several rows per pass, within the budget
    assert all(sum(batch.sequence_lengths()[r] for r in mb) <= BUDGET for mb in step)  # type: ignore[union-attr]

    valid = batch.response_mask() > 0
    diff = (packed["lp"].logp - padded["lp"].logp)[valid].abs()
    assert float(diff.max()) < 0.1 and float(diff.mean()) < 0.01, (float(diff.max()), float(diff.mean()))
    assert packed["metrics"]["ppo_kl"] == 0.0  # logprobs and train ran the same micro-batches
    assert packed["metrics"]["loss"] == pytest.approx(padded["metrics"]["loss"], rel=2e-2, abs=1e-4)
    assert set(packed["grads"]) == set(padded["grads"])
    for name, want in padded["grads"].items():
        err = float((packed["grads"][name] - want).norm() / want.norm().clamp(min=1e-12))
        assert err < 5e-2, (name, err)
