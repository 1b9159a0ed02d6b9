"""Random-weight Qwen3-shaped Hugging Face directories for the GPU benchmarks: a config, bf16
safetensors with the model's real tensor names and shapes, and a tokenizer (a given one, e.g.
SmolLM2's, or a five-word stand-in for benchmarks that send token ids). Widths are Qwen2.5-0.5B's /
Qwen2.5-1.5B's and Qwen3-4B's, with Qwen3's q/k norms; the weights are N(0, 0.02), norms 1.

A directory is written beside its destination and renamed, so a half-written one is never reused;
``ensure_model_dir`` reuses a finished one (``.complete``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

COMPLETE = ".complete"

# hidden, layers, intermediate, heads, kv heads, head dim, vocab, tied embeddings
MODELS: dict[str, tuple[int, int, int, int, int, int, int, bool]] = {
    "0.5b": (896, 24, 4864, 14, 2, 64, 151936, True),
    "1.5b": (1536, 28, 8960, 12, 2, 128, 151936, True),
    "4b": (2560, 36, 9728, 32, 8, 128, 151936, True),
    "tiny": (256, 2, 512, 4, 2, 64, 1000, False),
}


def qwen3_config(model: str, vocab: int | None = None) -> dict[str, Any]:
    """Keyword arguments of transformers' Qwen3Config for one of ``MODELS``."""
    hidden, layers, inter, heads, kv, head_dim, default_vocab, tied = MODELS[model]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab or default_vocab,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 8192,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "pad_token_id": 1,
        "eos_token_id": 2,
    }


def qwen3_shapes(config: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """HF names and shapes of a Qwen3 model's tensors (as its safetensors hold them)."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    out = [("model.embed_tokens.weight", [vocab, h])]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [h]),
            (p + "self_attn.q_proj.weight", [heads * hd, h]),
            (p + "self_attn.k_proj.weight", [kv * hd, h]),
            (p + "self_attn.v_proj.weight", [kv * hd, h]),
            (p + "self_attn.o_proj.weight", [h, heads * hd]),
            (p + "self_attn.q_norm.weight", [hd]),
            (p + "self_attn.k_norm.weight", [hd]),
            (p + "post_attention_layernorm.weight", [h]),
            (p + "mlp.gate_proj.weight", [inter, h]),
            (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter]),
        ]
    out.append(("model.norm.weight", [h]))
    if not config["tie_word_embeddings"]:
        out.append(("lm_head.weight", [vocab, h]))
    return out


@torch.no_grad()
def random_weights(config: dict[str, Any], seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """bf16 weights: N(0, 0.02), norms 1 (generated on ``device``: a GPU makes a 4B model in a second)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in qwen3_shapes(config):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            out[name] = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(
                0.0, 0.02, generator=gen
            )
    return out


def write_tokenizer(dest: Path) -> None:
    """The least AutoTokenizer loads: five words (ids 0-4; pad 1, eos 2) in a fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, "hello": 3, "world": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    fast.save_pretrained(str(dest))


def write_model_dir(
    dest: Path, model: str, *, seed: int = 0, tokenizer: Path | None = None, device: str = "cpu"
) -> Path:
    """``dest``: config.json, model.safetensors, a tokenizer (copied from ``tokenizer`` if given,
    whose vocabulary size the config then takes; else the five-word stand-in)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen3Config

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer))) if tokenizer is not None else None
    config = qwen3_config(model, vocab)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        Qwen3Config(**config).save_pretrained(str(tmp))
        if tokenizer is not None:
            AutoTokenizer.from_pretrained(str(tokenizer)).save_pretrained(str(tmp))
        else:
            write_tokenizer(tmp)
        weights = random_weights(config, seed, device)
        save_file(
            {k: v.cpu() for k, v in weights.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / COMPLETE).touch()
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_model_dir(root: Path, model: str, **kwargs: Any) -> Path:
    """``root/qwen3-<model>``, written once (reused while ``.complete`` is there)."""
    dest = root / f"qwen3-{model}"
    if not (dest / COMPLETE).is_file():
        write_model_dir(dest, model, **kwargs)
    return dest


def model_bytes(model: str, vocab: int | None = None) -> int:
    config = qwen3_config(model, vocab)
    return sum(2 * _numel(shape) for _, shape in qwen3_shapes(config))


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
