"""``make_tiny_model``: a random-weight Llama- or Qwen2-style model with SmolLM2's tokenizer (so text
is real), for fast tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from .smollm2 import smollm2_tokenizer_dir


def make_tiny_model(
    dest: str | os.PathLike[str],
    *,
    arch: Literal["llama", "qwen2"] = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    seed: int = 0,
) -> Path:
    """Write a random-weight model with SmolLM2's tokenizer (vocab 49,152) to ``dest``; returns ``dest``.

    Same ``seed`` and shape give the same weights. fp32 safetensors, tied embeddings.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

    dest = Path(dest)
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Larger-than-default init so different seeds give clearly different greedy outputs.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.5)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return dest
