"""Model configs with real shapes and random HF weights, shared by the unit tests, GPU tests and
benchmarks (torch only; no megatron-core, no transformers, except ``cpu_patches``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from .arch import ModelShape

# HuggingFaceTB/SmolLM2-135M(-Instruct): Llama, 9 heads / 3 KV heads, tied embeddings.
SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}

# Qwen/Qwen3-0.6B's shape: head_dim 128 with hidden 1024 (q projection wider than hidden), qk-norm, tied.
QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
}

# Qwen/Qwen2.5-0.5B's shape: qkv biases, 14 heads / 2 KV heads, tied.
QWEN2_0_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,  # transformers 4.x style
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "use_sliding_window": False,
}

# A small untied Llama with a vocab that needs padding (32003 is not a multiple of 128).
LLAMA_UNTIED: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32003,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def with_layers(config: dict[str, Any], num_layers: int, **overrides: Any) -> dict[str, Any]:
    """A copy of ``config`` with fewer layers (real per-tensor shapes, cheaper models)."""
    return {**config, "num_hidden_layers": num_layers, **overrides}


def hf_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes of a model (tied: no lm_head.weight, as in its safetensors)."""
    h, f, d = shape.hidden_size, shape.ffn_hidden_size, shape.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (shape.q_size, h)
        out[p + "self_attn.k_proj.weight"] = (shape.kv_size, h)
        out[p + "self_attn.v_proj.weight"] = (shape.kv_size, h)
        if shape.qkv_bias:
            out[p + "self_attn.q_proj.bias"] = (shape.q_size,)
            out[p + "self_attn.k_proj.bias"] = (shape.kv_size,)
            out[p + "self_attn.v_proj.bias"] = (shape.kv_size,)
        if shape.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "self_attn.o_proj.weight"] = (h, shape.q_size)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "mlp.gate_proj.weight"] = (f, h)
        out[p + "mlp.up_proj.weight"] = (f, h)
        out[p + "mlp.down_proj.weight"] = (h, f)
    out["model.norm.weight"] = (h,)
    if not shape.tied_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, h)
    return out


def random_hf_state(
    shape: ModelShape, *, dtype: torch.dtype = torch.float32, seed: int = 0, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Random HF weights: matrices N(0, 0.02), biases N(0, 0.02), norm weights 1 + N(0, 0.1) (not all
    ones, so a swapped or misplaced norm shows in the logits)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, size in hf_shapes(shape).items():
        t = torch.randn(size, generator=gen, device=device, dtype=torch.float32)
        is_norm = name.endswith(("norm.weight", "layernorm.weight"))
        out[name] = (1.0 + 0.1 * t if is_norm else 0.02 * t).to(dtype)
    return out


def cpu_patches() -> None:
    """Let megatron-core 0.16.1 run a model on CPU (tests and smoke runs only; process-wide): it reaches
    for CUDA for the rotary cache device and for the TP RNG tracker around attention dropout (the
    default causal mask too, which ``model.forward_logits`` avoids by passing its own)."""
    from megatron.core.tensor_parallel import random as mp_random

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]  # a CPU stand-in
    mp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()


def stored_tensors(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a torch_dist checkpoint, whole (read in this process, no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(directory))
    metadata = reader.read_metadata().state_dict_metadata
    state = {
        k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for k, m in metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state
