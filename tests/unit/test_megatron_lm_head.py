"""The chunked LM head (trainer/megatron/lm_head.py) on CPU: log-probs and both gradients equal the
full-logits computation, over chunks that do not divide the tokens, with vocabulary padding and a
temperature; split over two tensor-parallel ranks (gloo); and glued onto a real GPTModel."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from spawned_ranks import spawn_ranks

from rljob_runtime.trainer.megatron.lm_head import (
    chunk_tokens,
    chunked_token_logprobs,
    output_weight,
    return_hidden_states,
)

VOCAB, PADDED, HIDDEN = 13, 16, 8


def reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = (hidden.double() @ weight.double().t())[..., :VOCAB] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 5, HIDDEN, generator=gen)
    weight = torch.randn(PADDED, HIDDEN, generator=gen)
    weight[VOCAB:] = 50.0  # padding rows with large logits: must not count
    targets = torch.randint(0, VOCAB, (2, 5), generator=gen)
    upstream = torch.randn(2, 5, generator=gen)  # a loss that weighs tokens differently
    return hidden, weight, targets, upstream


def grads(fn: Any, hidden: torch.Tensor, weight: torch.Tensor, upstream: torch.Tensor) -> list[torch.Tensor]:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = fn(h, w)
    (out * upstream).sum().backward()
    return [out.detach().double(), h.grad.double(), w.grad.double()]  # type: ignore[union-attr]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_full_logits_over_uneven_chunks(temperature: float) -> None:
    hidden, weight, targets, upstream = inputs()
    chunk_bytes = 4 * PADDED * 3  # 3 tokens per chunk: 10 tokens = 3 + 3 + 3 + 1
    assert chunk_tokens(PADDED, chunk_bytes) == 3

    def ours(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return chunked_token_logprobs(
            h, w, targets, vocab_size=VOCAB, temperature=temperature, chunk_bytes=chunk_bytes
        )

    def theirs(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return reference(h, w, targets, temperature)

    got, want = grads(ours, hidden, weight, upstream), grads(theirs, hidden, weight, upstream)
    assert got[0].shape == (2, 5) and got[0].max() < 0
    for name, a, b in zip(("logp", "grad hidden", "grad weight"), got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), f"{name}: max diff {(a - b).abs().max():.3g}"
    assert got[2][VOCAB:].abs().max() == 0  # padding rows get no gradient


def test_bad_arguments_are_refused() -> None:
    hidden, weight, targets, _ = inputs()
    with pytest.raises(ValueError, match="temperature must be positive"):
        chunked_token_logprobs(hidden, weight, targets, vocab_size=VOCAB, temperature=0)
    with pytest.raises(ValueError, match=r"hidden \(2, 5, 8\) and targets \(2, 4\) disagree"):
        chunked_token_logprobs(hidden, weight, targets[:, :4], vocab_size=VOCAB)
    assert chunk_tokens(10**9) == 1


# ------------------------------------------------------------------ two ranks (gloo, CPU processes)


def _tp_worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    hidden, weight, targets, upstream = inputs(seed=1)
    # rank 1's half (rows 8..15) holds 5 real rows and all the padding; targets fall in both halves
    shard = weight[rank * PADDED // 2 : (rank + 1) * PADDED // 2]
    temperature = 0.8

    def ours(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return chunked_token_logprobs(
            h, w, targets, vocab_size=VOCAB, temperature=temperature, group=dist.group.WORLD, chunk_bytes=96
        )

    got = grads(ours, hidden, shard, upstream)
    want = grads(lambda h, w: reference(h, w, targets, temperature), hidden, weight, upstream)
    want[2] = want[2][rank * PADDED // 2 : (rank + 1) * PADDED // 2]
    torch.save([(a - b).abs().max().item() for a, b in zip(got, want, strict=True)], f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_tensor_parallel_ranks(tmp_path: Any) -> None:
    out = str(tmp_path / "diff")
    spawn_ranks(_tp_worker, out)
    for rank in range(2):
        diffs = torch.load(f"{out}.{rank}")
        assert max(diffs) < 1e-5, f"rank {rank}: max diffs (logp, grad hidden, grad weight) {diffs}"


# ------------------------------------------------------------------ on a GPTModel


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_gpt_model_hidden_states_give_the_models_logprobs(cpu_megatron: None, tied: bool) -> None:
    from rljob_runtime.trainer.megatron import model_shape, validate_parallelism
    from rljob_runtime.trainer.megatron.model import (
        build_gpt_model,
        causal_mask,
        forward_logits,
        init_model_parallel,
    )
    from rljob_runtime.trainer.megatron.testing import SMOLLM2_135M

    config = {
        **SMOLLM2_135M,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 250,  # padded to 256 by Megatron
        "tie_word_embeddings": tied,
    }
    shape = model_shape(config)
    par = validate_parallelism(shape, gpus=1)
    init_model_parallel(par, seed=0)
    model = build_gpt_model(shape, par, dtype=torch.float32)
    ids = torch.randint(0, shape.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    targets = ids.roll(-1, dims=1)

    logits = forward_logits(model, ids, shape)
    want = torch.log_softmax(logits.double(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    want.sum().backward()
    weight = output_weight(model)
    want_grad = weight.grad.clone()  # type: ignore[union-attr]
    weight.grad = None
    assert (weight is model.embedding.word_embeddings.weight) == tied

    return_hidden_states(model)
    hidden = model(ids, torch.arange(9)[None].expand(2, 9), causal_mask(9, "cpu"))
    assert hidden.shape == (2, 9, 64)
    got = chunked_token_logprobs(
        hidden, weight, targets, vocab_size=shape.vocab_size, chunk_bytes=4 * 256 * 4
    )
    got.sum().backward()
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()
    # tied: the embedding's own gradient adds to the head's, as in the full-logits model
    assert torch.allclose(weight.grad, want_grad, atol=1e-5), (weight.grad - want_grad).abs().max()  # type: ignore[operator]
