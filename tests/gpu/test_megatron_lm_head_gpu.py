"""The chunked LM head (``trainer/megatron/lm_head.py``) in bf16 on a GPU: its log-probs and both
gradients are no farther from an fp64 reference than the full-logits bf16 computation the MFU
benchmark's default head does, with a realistic vocabulary (151,936, padded) over several chunks.
The CPU twin (fp32, exact to 1e-5, two TP ranks) is tests/unit/test_megatron_lm_head.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("megatron.core")

from rljob_runtime.trainer.megatron.lm_head import chunk_tokens, chunked_token_logprobs

VOCAB, PADDED, HIDDEN, TOKENS = 151_936, 152_064, 512, 1_000


def _run(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    upstream: torch.Tensor,
) -> list[torch.Tensor]:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = fn(h, w)
    (out * upstream).sum().backward()
    return [out.detach().double(), h.grad.double(), w.grad.double()]  # type: ignore[union-attr]


def test_chunked_head_is_as_accurate_as_full_logits() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, device="cuda", generator=gen).bfloat16()
    weight = (torch.randn(PADDED, HIDDEN, device="cuda", generator=gen) * 0.05).bfloat16()
    targets = torch.randint(0, VOCAB, (TOKENS,), device="cuda", generator=gen)
    upstream = torch.randn(TOKENS, device="cuda", generator=gen)
    chunk_bytes = 64 * 2**20  # 110 tokens per chunk: 10 chunks, the last one short
    assert chunk_tokens(PADDED, chunk_bytes) == 110

    def exact(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        logits = (h.double() @ w.double().t())[:, :VOCAB]
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)

    def full(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # bf16 GEMM, fp32 softmax
        logits = (h @ w.t())[:, :VOCAB].float()
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)

    def chunked(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return chunked_token_logprobs(h, w, targets, vocab_size=VOCAB, chunk_bytes=chunk_bytes)

    ref = _run(exact, hidden.double(), weight.double(), upstream)
    base = _run(full, hidden, weight, upstream)
    ours = _run(chunked, hidden, weight, upstream)
    for name, r, b, o in zip(("logp", "grad hidden", "grad weight"), ref, base, ours, strict=True):
        err_base, err_ours = float((b - r).abs().max()), float((o - r).abs().max())
        scale = float(r.abs().max())
        assert err_ours <= 1.5 * err_base + 1e-3 * scale, (
            f"{name}: chunked max error {err_ours:.3g}, full-logits bf16 {err_base:.3g} (max |ref| {scale:.3g})"
        )
    assert ours[2][VOCAB:].abs().max() == 0  # padding rows get no gradient
