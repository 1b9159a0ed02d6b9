"""RoPE inverse frequencies as transformers computes them, for the scaled RoPE types megatron-core does
not build exactly (torch only, no megatron-core).

megatron-core 0.16.1's ``RotaryEmbedding(rope_scaling=True, rope_scaling_factor=f)`` applies Llama
3.1's scaling with ``low_freq_factor`` 1, ``high_freq_factor`` 4 and ``original_max_position_embeddings``
8192 hard-coded (``_apply_scaling``'s defaults; GPTModel passes only the factor), so a llama3 config
with other values would be trained with other frequencies than the engines (SGLang, transformers)
use. ``model.build_gpt_model`` sets the rotary module's ``inv_freq`` from here instead.
"""

from __future__ import annotations

import math

import torch

from .arch import ModelShape


def default_inv_freq(theta: float, dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[dim / 2] float32: theta ** (-2i / dim), in transformers' order of operations (bit-equal)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (theta**exponents)


def inv_freq(shape: ModelShape, device: torch.device | str | None = None) -> torch.Tensor:
    """The inverse frequencies transformers uses for ``shape`` (``_compute_llama3_parameters``,
    ``_compute_linear_scaling_rope_parameters`` or the default), float32 on ``device``."""
    freqs = default_inv_freq(shape.rope_theta, shape.head_dim, device)
    scaling = shape.rope_scaling
    if scaling is None:
        return freqs
    if scaling.rope_type == "linear":
        return freqs / scaling.factor
    if scaling.rope_type != "llama3":
        raise ValueError(f"no inverse frequencies for RoPE type {scaling.rope_type!r}")
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / freqs
    # Long wavelengths (low frequencies, beyond the original context) are slowed by `factor`, short
    # ones kept; the band between is interpolated smoothly.
    scaled = torch.where(wavelen > old_context / low, freqs / factor, freqs)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
    return torch.where(medium, smoothed, scaled)
