"""Which Hugging Face architectures the megatron backend builds, and their shape.

All three supported architectures are Llama-like decoders with the same HF weight names: RMSNorm,
SwiGLU MLP, grouped-query attention, RoPE. They differ in qkv bias (Qwen2), qk-norm (Qwen3) and
whether the LM head is tied to the embedding. Anything outside that (other biases, sliding window,
RoPE scaling, other activations) is refused by name rather than silently converted wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class UnsupportedModelError(ValueError):
    """An HF model the megatron backend cannot build (architecture or feature)."""


@dataclass(frozen=True)
class ModelShape:
    """What the converters and the model builder need from an HF config."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope_theta: float
    norm_eps: float
    max_position_embeddings: int

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):  # transformers.PretrainedConfig
        return dict(config.to_dict())
    raise TypeError(f"expected an HF config (dict or PretrainedConfig), got {type(config).__name__}")


def _architecture(cfg: Mapping[str, Any]) -> str:
    archs = cfg.get("architectures") or []
    if not archs:  # a config built in code has no architectures list: infer from model_type
        by_type = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        archs = [by_type.get(str(cfg.get("model_type")), f"model_type {cfg.get('model_type')!r}")]
    arch = str(archs[0])
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"HF architecture {arch} is not supported by the megatron backend; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    # transformers 5 keeps RoPE settings in rope_parameters; 4.x in rope_theta / rope_scaling.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise UnsupportedModelError(
            f"RoPE type {rope_type!r} is not supported by the megatron backend (only 'default')"
        )
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise UnsupportedModelError("the HF config has no rope_theta (rope_parameters.rope_theta)")
    return float(theta)


def _refuse(cond: bool, arch: str, what: str) -> None:
    if cond:
        raise UnsupportedModelError(f"{arch} with {what} is not supported by the megatron backend")


def model_shape(config: Any) -> ModelShape:
    """The ``ModelShape`` of an HF config (dict, e.g. config.json, or a PretrainedConfig).

    Raises ``UnsupportedModelError`` (a ValueError) naming what is not supported.
    """
    cfg = _as_dict(config)
    arch = _architecture(cfg)
    _refuse(cfg.get("hidden_act", "silu") != "silu", arch, f"hidden_act {cfg.get('hidden_act')!r}")
    _refuse(bool(cfg.get("use_sliding_window")), arch, "use_sliding_window")
    _refuse(bool(cfg.get("mlp_bias")), arch, "mlp_bias")
    layer_types = cfg.get("layer_types") or []
    _refuse(any(t != "full_attention" for t in layer_types), arch, f"layer_types {sorted(set(layer_types))}")
    # Qwen2 always has q/k/v biases; Llama/Qwen3 attention_bias adds an o_proj bias too, which the
    # local Megatron spec cannot express without biasing the MLP as well.
    _refuse(arch != "Qwen2ForCausalLM" and bool(cfg.get("attention_bias")), arch, "attention_bias")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise UnsupportedModelError(
            f"{arch}: {heads} attention heads are not a multiple of {kv_heads} KV heads"
        )
    return ModelShape(
        architecture=arch,
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        ffn_hidden_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        rope_theta=_rope_theta(cfg),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
    )
