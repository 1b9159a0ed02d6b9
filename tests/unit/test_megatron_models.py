"""Every size of Qwen2.5 and Qwen3 (dense) on the megatron backend, from the real config.json shape
fields: model_shape parses them (head_dim, tied or untied embeddings, qkv bias, qk-norm), the
parameter count matches the published size, and tensor-parallel sizes are accepted exactly where
heads, key/value heads and the MLP split evenly (pure; no megatron-core)."""

from __future__ import annotations

from typing import Any

import pytest

from rljob_runtime.trainer.megatron.arch import model_shape
from rljob_runtime.trainer.megatron.parallel import validate_parallelism
from rljob_runtime.trainer.megatron.testing import hf_shapes


def _qwen2(
    hidden: int, layers: int, heads: int, kv: int, ffn: int, vocab: int, tied: bool, max_pos: int
) -> dict[str, Any]:
    # Qwen2.5's config.json: qkv biases (implied by the architecture), sliding window off.
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": ffn,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "rope_theta": 1000000.0,
        "max_position_embeddings": max_pos,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "max_window_layers": layers,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }


def _qwen3(hidden: int, layers: int, heads: int, ffn: int, tied: bool) -> dict[str, Any]:
    # Qwen3 dense: head_dim 128 at every size (0.6B: 16 x 128 = 2048 > hidden 1024), 8 KV heads.
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": ffn,
        "vocab_size": 151936,
        "tie_word_embeddings": tied,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "max_position_embeddings": 40960,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": layers,
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }


# name -> (config, published parameters in billions (model cards), TP sizes that fit among TP_CANDIDATES)
MODELS: dict[str, tuple[dict[str, Any], float, tuple[int, ...]]] = {
    "Qwen2.5-0.5B": (_qwen2(896, 24, 14, 2, 4864, 151936, True, 32768), 0.49, (1, 2)),
    "Qwen2.5-1.5B": (_qwen2(1536, 28, 12, 2, 8960, 151936, True, 131072), 1.54, (1, 2, 4)),
    "Qwen2.5-3B": (_qwen2(2048, 36, 16, 2, 11008, 151936, True, 32768), 3.09, (1, 2, 4, 8, 16)),
    "Qwen2.5-7B": (_qwen2(3584, 28, 28, 4, 18944, 152064, False, 131072), 7.61, (1, 2, 4)),
    "Qwen2.5-14B": (_qwen2(5120, 48, 40, 8, 13824, 152064, False, 131072), 14.7, (1, 2, 4, 8)),
    "Qwen2.5-32B": (_qwen2(5120, 64, 40, 8, 27648, 152064, False, 131072), 32.5, (1, 2, 4, 8)),
    "Qwen2.5-72B": (_qwen2(8192, 80, 64, 8, 29568, 152064, False, 131072), 72.7, (1, 2, 4, 8, 16, 32, 64)),
    "Qwen3-0.6B": (_qwen3(1024, 28, 16, 3072, True), 0.6, (1, 2, 4, 8, 16)),
    "Qwen3-1.7B": (_qwen3(2048, 28, 16, 6144, True), 1.7, (1, 2, 4, 8, 16)),
    "Qwen3-4B": (_qwen3(2560, 36, 32, 9728, True), 4.0, (1, 2, 4, 8, 16, 32)),
    "Qwen3-8B": (_qwen3(4096, 36, 32, 12288, False), 8.2, (1, 2, 4, 8, 16, 32)),
    "Qwen3-14B": (_qwen3(5120, 40, 40, 17408, False), 14.8, (1, 2, 4, 8)),
    "Qwen3-32B": (_qwen3(5120, 64, 64, 25600, False), 32.8, (1, 2, 4, 8, 16, 32, 64)),
}
TP_CANDIDATES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shape_is_parsed(name: str) -> None:
    config = MODELS[name][0]
    shape = model_shape(config)
    qwen3 = name.startswith("Qwen3")
    assert (shape.qkv_bias, shape.qk_norm) == (not qwen3, qwen3)
    assert shape.tied_embeddings == config["tie_word_embeddings"]
    assert shape.head_dim == (128 if qwen3 else config["hidden_size"] // config["num_attention_heads"])
    assert shape.rope_theta == 1e6 and shape.rope_scaling is None
    assert (shape.num_heads, shape.num_kv_heads) == (
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )


def test_qwen3_0_6b_attention_is_wider_than_hidden() -> None:
    shape = model_shape(MODELS["Qwen3-0.6B"][0])
    assert (shape.hidden_size, shape.num_heads, shape.head_dim, shape.q_size) == (1024, 16, 128, 2048)
    assert hf_shapes(shape)["model.layers.0.self_attn.o_proj.weight"] == (1024, 2048)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_matches_the_published_size(name: str) -> None:
    config, billions, _ = MODELS[name]
    count = 0
    for size in hf_shapes(model_shape(config)).values():
        n = 1
        for d in size:
            n *= d
        count += n
    # Model cards round to 2-3 digits (Qwen3-0.6B is 0.596B; tied models count the embedding once).
    assert abs(count / 1e9 - billions) / billions < 0.03, f"{name}: {count / 1e9:.3f}B vs {billions}B"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tensor_parallel_sizes_that_fit_are_accepted_and_others_refused(name: str) -> None:
    config, _, fits = MODELS[name]
    shape = model_shape(config)
    for tp in TP_CANDIDATES:
        if tp in fits:
            par = validate_parallelism(shape, tp=tp, gpus=tp * 2)
            assert (par.tp, par.dp) == (tp, 2)
            continue
        with pytest.raises(ValueError, match=f"tensor parallel size {tp}") as refused:
            validate_parallelism(shape, tp=tp, gpus=tp)
        message = str(refused.value)
        assert message.startswith(f"parallelism does not fit {shape.architecture}: "), message
        # Each refusal names the count that does not split.
        named = (
            f"{shape.num_heads} attention heads",
            f"{shape.num_kv_heads} key/value heads",
            f"MLP size {shape.ffn_hidden_size}",
        )
        assert any(n in message for n in named), message
