"""RoPE scaling on the megatron backend: which rope types model_shape accepts (pure), the inverse
frequencies against transformers' (bit-equal), and a Llama 3.2-like model (llama3 scaling, tied
embeddings) whose Megatron logits equal transformers' at positions past the original context, on CPU
in float32. Megatron parts are skipped where megatron-core is not installed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rljob_runtime.trainer.megatron.arch import RopeScaling, UnsupportedModelError, model_shape
from rljob_runtime.trainer.megatron.rope import default_inv_freq, inv_freq
from rljob_runtime.trainer.megatron.testing import SMOLLM2_135M, random_hf_state

# Llama-3.2-1B's RoPE (transformers 5 style: everything in rope_parameters).
LLAMA32_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# A tiny Llama 3.2 (tied embeddings) whose RoPE bands all fall inside a short sequence: head_dim 32 and
# theta 10000 give wavelengths 6.3 .. 35000; with an original context of 64 (high band < 16, low band
# > 64) dims 0-1 stay, 2-4 are interpolated and 5-15 are divided by the factor, and the test's 96
# positions run past the original 64.
TINY_LLAMA3: dict[str, Any] = {
    **SMOLLM2_135M,
    "hidden_size": 128,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 300,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}
TINY_LINEAR: dict[str, Any] = {
    **TINY_LLAMA3,
    "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
}


def _llama(rope: dict[str, Any], style: str = "v5") -> dict[str, Any]:
    base = {k: v for k, v in SMOLLM2_135M.items() if k != "rope_parameters"}
    if style == "v5":
        return {**base, "rope_parameters": rope}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {**base, "rope_theta": rope["rope_theta"], "rope_scaling": scaling}


# ------------------------------------------------------------------------------------ pure


@pytest.mark.parametrize("style", ["v5", "v4"])
def test_llama3_scaling_is_parsed_from_both_config_styles(style: str) -> None:
    shape = model_shape(_llama(LLAMA32_ROPE, style))
    assert shape.rope_theta == 500000.0
    assert shape.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)


def test_old_type_key_and_default_type() -> None:
    old = _llama({"type": "linear", "factor": 2.0, "rope_theta": 1e4}, "v4")
    assert model_shape(old).rope_scaling == RopeScaling("linear", 2.0)
    assert model_shape(SMOLLM2_135M).rope_scaling is None
    assert model_shape({**SMOLLM2_135M, "rope_scaling": None}).rope_scaling is None


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope", "proportional", "mrope"])
def test_other_rope_types_are_refused_by_name(rope_type: str) -> None:
    rope = {"rope_type": rope_type, "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(UnsupportedModelError, match=f"RoPE type '{rope_type}' is not supported.*llama3"):
        model_shape(_llama(rope))


def test_incomplete_or_partial_rope_is_refused() -> None:
    no_band = {k: v for k, v in LLAMA32_ROPE.items() if k != "low_freq_factor"}
    with pytest.raises(UnsupportedModelError, match="without low_freq_factor"):
        model_shape(_llama(no_band))
    with pytest.raises(UnsupportedModelError, match=r"partial_rotary_factor 0\.5"):
        model_shape(_llama({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}))


def test_default_inv_freq_is_megatron_cores_formula() -> None:
    theta, dim = 500000.0, 64
    megatron = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    assert torch.equal(default_inv_freq(theta, dim), megatron)


def _hf_config(config: dict[str, Any]) -> Any:
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    return transformers.AutoConfig.for_model(config["model_type"], **fields)


@pytest.mark.parametrize(
    "config",
    [
        _llama(LLAMA32_ROPE),
        _llama({**LLAMA32_ROPE, "factor": 8.0}),  # Llama 3.1
        # Limits megatron-core hard-codes (1, 4, 8192) set otherwise.
        _llama({**LLAMA32_ROPE, "low_freq_factor": 2.0, "high_freq_factor": 16.0}),
        TINY_LLAMA3,
        TINY_LINEAR,
        SMOLLM2_135M,
    ],
    ids=["llama3.2", "llama3.1", "llama3-other-bands", "tiny-llama3", "tiny-linear", "default"],
)
def test_inv_freq_equals_transformers(config: dict[str, Any]) -> None:
    hf = _hf_config(config)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = hf.rope_parameters["rope_type"]
    if rope_type == "default":
        theirs = default_inv_freq(hf.rope_parameters["rope_theta"], hf.head_dim)
    else:
        theirs, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
        assert attention_factor == 1.0  # nothing scales the attention: frequencies are everything
    assert torch.equal(inv_freq(model_shape(config)), theirs)


def test_tiny_llama3_covers_every_band() -> None:
    """The equivalence test below only means something if the scaling changes frequencies in all
    three bands: some kept, some divided by the factor, some interpolated."""
    shape = model_shape(TINY_LLAMA3)
    plain, scaled = default_inv_freq(shape.rope_theta, shape.head_dim), inv_freq(shape)
    ratio = plain / scaled
    assert (ratio == 1).sum() >= 2 and (ratio == 8).sum() >= 2
    assert ((ratio > 1) & (ratio < 8)).sum() >= 2


# ------------------------------------------------------------------ megatron-core on CPU


def _hf_model(config: dict[str, Any], state: dict[str, torch.Tensor]) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(_hf_config(config), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


@pytest.mark.parametrize("config", [TINY_LLAMA3, TINY_LINEAR], ids=["llama3-tied", "linear"])
def test_scaled_rope_logits_match_transformers(cpu_megatron: None, config: dict[str, Any]) -> None:
    pytest.importorskip("megatron.core")
    from rljob_runtime.trainer.megatron.model import build_gpt_model, forward_logits, init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import validate_parallelism

    shape = model_shape(config)
    par = validate_parallelism(shape, gpus=1)
    init_model_parallel(par)
    hf_state = random_hf_state(shape, seed=3)
    ids = torch.randint(0, shape.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = _hf_model(config, hf_state)(input_ids=ids).logits

    def logits(frequencies: torch.Tensor | None) -> torch.Tensor:
        from rljob_runtime.trainer.megatron.model import load_hf_weights

        model = build_gpt_model(shape, par, dtype=torch.float32).eval()
        load_hf_weights(model, hf_state, shape, par)
        if frequencies is not None:
            model.rotary_pos_emb.inv_freq = frequencies
        with torch.no_grad():
            return forward_logits(model, ids, shape)

    diff = float((logits(None) - theirs).abs().max())
    assert diff < 1e-4, f"max abs diff {diff:.3g} (logits std {float(theirs.std()):.3g})"
    # Without the scaling (plain frequencies) the same weights give other logits: the test can fail.
    unscaled = float((logits(default_inv_freq(shape.rope_theta, shape.head_dim)) - theirs).abs().max())
    assert unscaled > 100 * max(diff, 1e-6), f"unscaled RoPE differs by only {unscaled:.3g}"


def test_megatron_cores_own_llama3_scaling_hard_codes_the_bands() -> None:
    """Why build_gpt_model sets inv_freq itself: RotaryEmbedding(rope_scaling=True) ignores the
    config's original_max_position_embeddings (and low/high factors), so TINY_LLAMA3 would be wrong."""
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    shape = model_shape(TINY_LLAMA3)
    assert shape.rope_scaling is not None
    theirs = RotaryEmbedding(
        kv_channels=shape.head_dim,
        rotary_percent=1.0,
        rotary_base=int(shape.rope_theta),
        rope_scaling=True,
        rope_scaling_factor=shape.rope_scaling.factor,
        use_cpu_initialization=True,
    ).inv_freq
    assert not torch.allclose(theirs, inv_freq(shape))
    # ... and with Llama 3.1's own limits the two agree (same formula).
    llama31 = model_shape(_llama({**LLAMA32_ROPE, "factor": 8.0, "rope_theta": 10000.0}))
    assert torch.allclose(
        RotaryEmbedding(
            kv_channels=llama31.head_dim,
            rotary_percent=1.0,
            rotary_base=10000,
            rope_scaling=True,
            rope_scaling_factor=8.0,
            use_cpu_initialization=True,
        ).inv_freq,
        inv_freq(llama31),
    )
