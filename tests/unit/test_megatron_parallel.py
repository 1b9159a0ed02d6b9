"""Architecture registry and parallelism validation of the megatron backend (pure, no megatron-core)."""

from __future__ import annotations

import pytest

from rljob_runtime.trainer.megatron import (
    SUPPORTED_ARCHITECTURES,
    Parallelism,
    UnsupportedModelError,
    model_shape,
    validate_parallelism,
)
from rljob_runtime.trainer.megatron.testing import LLAMA_UNTIED, QWEN2_0_5B, QWEN3_0_6B, SMOLLM2_135M


def test_shapes_of_the_supported_architectures() -> None:
    smol = model_shape(SMOLLM2_135M)
    assert (smol.num_heads, smol.num_kv_heads, smol.head_dim, smol.heads_per_group) == (9, 3, 64, 3)
    assert smol.tied_embeddings and not smol.qkv_bias and not smol.qk_norm
    assert smol.rope_theta == 100000.0
    qwen3 = model_shape(QWEN3_0_6B)
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.q_size == 2048 and qwen3.hidden_size == 1024
    qwen2 = model_shape(QWEN2_0_5B)  # 4.x-style rope_theta, no head_dim
    assert qwen2.qkv_bias and qwen2.head_dim == 64 and qwen2.rope_theta == 1e6
    assert not model_shape(LLAMA_UNTIED).tied_embeddings


def test_unsupported_architecture_lists_the_supported_ones() -> None:
    with pytest.raises(UnsupportedModelError) as err:
        model_shape({**SMOLLM2_135M, "architectures": ["MistralForCausalLM"]})
    message = str(err.value)
    assert "MistralForCausalLM" in message
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in message
    with pytest.raises(UnsupportedModelError, match="model_type 'gemma'"):
        model_shape({"model_type": "gemma"})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}},
            "RoPE type 'llama3'",
        ),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_unsupported_features_are_refused_by_name(change: dict, match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        model_shape({**SMOLLM2_135M, **change})


def test_a_valid_layout_gets_its_data_parallel_size() -> None:
    assert validate_parallelism(QWEN3_0_6B, tp=2, gpus=2) == Parallelism(tp=2, pp=1, cp=1, dp=1)
    assert validate_parallelism(QWEN3_0_6B, tp=2, pp=2, gpus=8) == Parallelism(tp=2, pp=2, cp=1, dp=2)
    assert validate_parallelism(SMOLLM2_135M, tp=3, pp=5, gpus=15).dp == 1
    assert validate_parallelism(SMOLLM2_135M, gpus=4).dp == 4
    # KV heads fewer than TP ranks is fine for Megatron when TP is a multiple of them.
    assert validate_parallelism(QWEN3_0_6B, tp=16, gpus=16, dp=1).tp == 16


def test_heads_not_divisible_by_tp_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError) as err:
        validate_parallelism(SMOLLM2_135M, tp=2, gpus=2)
    message = str(err.value)
    assert "9 attention heads are not divisible by tensor parallel size 2" in message
    assert "3 key/value heads are neither a multiple nor a divisor of tensor parallel size 2" in message
    assert "LlamaForCausalLM" in message


def test_layers_not_divisible_by_pp_and_gpu_mismatch_are_refused() -> None:
    with pytest.raises(ValueError, match="28 layers are not divisible by pipeline parallel size 3"):
        validate_parallelism(QWEN3_0_6B, pp=3, gpus=3)
    with pytest.raises(
        ValueError, match="6 GPUs are not a multiple of tensor 4 x pipeline 1 x context 1 = 4"
    ):
        validate_parallelism(QWEN3_0_6B, tp=4, gpus=6)
    with pytest.raises(
        ValueError, match=r"tensor 2 x pipeline 2 x context 1 x data 2 = 8 does not equal the 4 GPUs"
    ):
        validate_parallelism(QWEN3_0_6B, tp=2, pp=2, dp=2, gpus=4)
    with pytest.raises(ValueError, match="MLP size 1410 is not divisible by tensor parallel size 4"):
        validate_parallelism({**LLAMA_UNTIED, "intermediate_size": 1410}, tp=4, gpus=4)
    with pytest.raises(ValueError, match="sizes must be >= 1: tensor parallel size 0"):
        validate_parallelism(QWEN3_0_6B, tp=0, gpus=2)


def test_context_parallel_needs_transformer_engine() -> None:
    with pytest.raises(ValueError, match="context parallel size 2 needs TransformerEngine"):
        validate_parallelism(QWEN3_0_6B, cp=2, gpus=2)
    assert validate_parallelism(QWEN3_0_6B, cp=2, gpus=2, transformer_engine=True).cp == 2


def test_unsupported_architecture_is_refused_before_layout_checks() -> None:
    with pytest.raises(
        UnsupportedModelError,
        match="DeepseekV3ForCausalLM is not supported by the megatron backend; supported: LlamaForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, MixtralForCausalLM",
    ):
        validate_parallelism({**QWEN3_0_6B, "architectures": ["DeepseekV3ForCausalLM"]}, tp=2, gpus=2)
