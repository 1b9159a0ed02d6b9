"""Which Hugging Face architectures the megatron backend builds, and their shape.

All supported architectures are Llama-like decoders with the same HF weight names: RMSNorm,
SwiGLU MLP, grouped-query attention, RoPE. They differ in qkv bias (Qwen2, Qwen2-MoE), qk-norm (Qwen3
and Qwen3-MoE) and whether the LM head is tied to the embedding, and in RoPE scaling: none, Llama
3.1+'s "llama3" or "linear" (``rope.py`` computes the frequencies). Qwen3-MoE, Qwen2-MoE and Mixtral
are Qwen3, Qwen2 and Llama whose MoE layers' MLP is a router and experts, plus Qwen2-MoE's gated shared
expert (``ModelShape.moe``, from ``moe.moe_shape``). Anything outside that (other
biases, sliding window, other RoPE types, other activations) is refused by name rather than silently
converted wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .moe import MOE_ARCHITECTURES, MoEShape, moe_shape

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    *MOE_ARCHITECTURES,
)
_QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_QKV_BIAS_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")
# RoPE types (transformers' rope_type) whose frequencies rope.py reproduces; "default" is no scaling.
# dynamic / yarn / longrope change with the sequence length or scale the attention: not built here.
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "llama3", "linear")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class UnsupportedModelError(ValueError):
    """An HF model the megatron backend cannot build (architecture or feature)."""


@dataclass(frozen=True)
class RopeScaling:
    """transformers' RoPE scaling of the inverse frequencies ("llama3": Llama 3.1+'s by wavelength band;
    "linear": all divided by ``factor``; the other fields are llama3's only)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
    rope_scaling: RopeScaling | None = None  # None: plain RoPE (rope_type "default")
    moe: MoEShape | None = None  # None: a dense model (every layer's MLP is ffn_hidden_size wide)

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

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
        by_type = {
            "llama": "LlamaForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM",
            "qwen2_moe": "Qwen2MoeForCausalLM",
            "mixtral": "MixtralForCausalLM",
        }
        archs = [by_type.get(str(cfg.get("model_type")), f"model_type {cfg.get('model_type')!r}")]
    arch = str(archs[0])
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"HF architecture {arch} is not supported by the megatron backend; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _rope_params(cfg: Mapping[str, Any]) -> dict[str, Any]:
    # transformers 5 keeps RoPE settings in rope_parameters; 4.x in rope_theta / rope_scaling.
    params = dict(cfg.get("rope_parameters") or {})
    params.update({k: v for k, v in (cfg.get("rope_scaling") or {}).items() if v is not None})
    if "rope_type" not in params and "type" in params:  # older configs: rope_scaling.type
        params["rope_type"] = params["type"]
    params.setdefault("rope_theta", cfg.get("rope_theta"))
    return params


def _rope(cfg: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, refused by name when rope.py cannot reproduce transformers'."""
    params = _rope_params(cfg)
    rope_type = str(params.get("rope_type") or "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type {rope_type!r} is not supported by the megatron backend "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError(
            f"partial_rotary_factor {params['partial_rotary_factor']} is not supported by the megatron "
            "backend (RoPE over the whole head only)"
        )
    if params.get("rope_theta") is None:
        raise UnsupportedModelError("the HF config has no rope_theta (rope_parameters.rope_theta)")
    theta = float(params["rope_theta"])
    if rope_type == "default":
        return theta, None
    needed = _LLAMA3_KEYS if rope_type == "llama3" else ("factor",)
    missing = [k for k in needed if params.get(k) is None]
    if missing:
        raise UnsupportedModelError(f"RoPE type {rope_type!r} without {', '.join(missing)} in the HF config")
    if rope_type == "linear":
        return theta, RopeScaling("linear", float(params["factor"]))
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    if high <= low:  # transformers divides by high - low
        raise UnsupportedModelError(f"llama3 RoPE with high_freq_factor {high} <= low_freq_factor {low}")
    return theta, RopeScaling(
        "llama3", float(params["factor"]), low, high, int(params["original_max_position_embeddings"])
    )


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
    _refuse(arch not in _QKV_BIAS_ARCHITECTURES and bool(cfg.get("attention_bias")), arch, "attention_bias")
    # Mixtral attends within sliding_window tokens whenever it is set (Qwen2's only with use_sliding_window)
    _refuse(arch == "MixtralForCausalLM" and cfg.get("sliding_window") is not None, arch, "sliding_window")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    rope_theta, rope_scaling = _rope(cfg)
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
        qkv_bias=arch in _QKV_BIAS_ARCHITECTURES,
        qk_norm=arch in _QK_NORM_ARCHITECTURES,
        rope_theta=rope_theta,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        rope_scaling=rope_scaling,
        moe=_moe(cfg, arch),
    )


def _moe(cfg: Mapping[str, Any], arch: str) -> MoEShape | None:
    """The MoE part of an MoE architecture's config; a dense architecture keeps None whatever its
    config says (its layers have no router to convert)."""
    if arch not in MOE_ARCHITECTURES:
        return None
    moe = moe_shape(cfg)
    if moe is None:
        raise UnsupportedModelError(f"{arch} without num_experts in the HF config")
    return moe
