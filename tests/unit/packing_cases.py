"""Samples of very different lengths for the packed == padded tests of both trainer backends
(training.dynamicBatch): short and long prompts and responses, one empty response, a masked tool span,
so that a packed micro-batch holds rows of every kind and any attention across rows shows. And the
tiny random Llama the torch backend's tests train on."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rljob_runtime.data.sample import Sample

# (prompt length, response length) per row: a global batch of 8, lengths from 3 to 40 tokens.
LENGTHS = ((3, 1), (12, 28), (2, 5), (5, 0), (4, 9), (20, 20), (1, 2), (7, 14))


def long_tail_samples(
    vocab_size: int, seed: int = 0, lengths: tuple[tuple[int, int], ...] = LENGTHS
) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, r) in enumerate(lengths):
        prompt = torch.randint(1, vocab_size, (p,), generator=gen).tolist()
        response = torch.randint(1, vocab_size, (r,), generator=gen).tolist()
        mask = [0 if 3 <= j < 6 else 1 for j in range(r)]  # a masked span (tool output) where there is room
        logp = (-torch.rand(r, generator=gen)).tolist()
        out.append(
            Sample(
                group_index=i // 4,
                index=i,
                prompt_ids=prompt,
                response_ids=response,
                loss_mask=mask,
                rollout_logprobs=logp,
            )
        )
    return out


def advantages_for(rows: int, width: int, seed: int = 1) -> torch.Tensor:
    """[rows, width] per-token advantages (one value per sample, as GRPO's), not all of one sign."""
    gen = torch.Generator().manual_seed(seed)
    per_sample = torch.randn(rows, generator=gen)
    return per_sample[:, None].expand(rows, width).clone()


def save_tiny_llama(dest: Path, vocab_size: int) -> Path:
    """A tiny random Llama (seed 0, float32, untied head) saved as a Hugging Face directory."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    assert json.loads((dest / "config.json").read_text())["vocab_size"] == vocab_size
    return dest
