"""The MoE families beside Qwen3-MoE on the megatron backend, against transformers on CPU: Qwen2-MoE
(q/k/v biases, a gated shared expert beside the routed ones, a dense layer among the MoE ones,
no renormalisation of the top k) and Mixtral (Llama attention, experts under ``block_sparse_moe`` as
w1/w3/w2, the top k renormalised). Each tiny random model is written by transformers as a checkpoint
is on disk, built by ``model.build_gpt_model`` from its config.json and loaded through the backend's
converter: its logits equal transformers', its HF export equals the checkpoint tensor for tensor, and
the memory check counts exactly its parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from safetensors.torch import load_file

from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.arch import UnsupportedModelError
from rljob_runtime.trainer.megatron.memory_plan import stage_param_counts
from rljob_runtime.trainer.megatron.model import (
    build_gpt_model,
    export_hf_weights,
    forward_logits,
    init_model_parallel,
    load_hf_weights,
    unwrap,
)
from rljob_runtime.trainer.megatron.parallel import validate_parallelism

COMMON: dict[str, Any] = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
    tie_word_embeddings=False,
)
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2-moe": dict(
        num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1]
    ),
    "mixtral": dict(num_local_experts=4),
}


def write_family(dest: Path, family: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    classes = {
        "qwen2-moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
        "mixtral": (MixtralConfig, MixtralForCausalLM),
    }
    config_cls, model_cls = classes[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**COMMON, **FAMILIES[family])).eval()
    with torch.no_grad():  # transformers zero-initialises some norms and gates: make every tensor count
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    model.save_pretrained(dest)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(dest.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return json.loads((dest / "config.json").read_text()), state, model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_export_and_parameter_count_match_transformers(
    tmp_path: Path, cpu_megatron: None, family: str
) -> None:
    config, on_disk, reference = write_family(tmp_path / family, family)
    shape = model_shape(config)
    assert shape.moe is not None
    if family == "qwen2-moe":
        assert (
            shape.qkv_bias
            and shape.moe.moe_layers == (0, 2)
            and shape.moe.shared_expert_ffn_hidden_size == 24
        )
        assert any(".mlp.shared_expert_gate." in k for k in on_disk)
    else:
        assert shape.moe.norm_topk_prob and shape.moe.expert_ffn_hidden_size == 48
        assert any(".block_sparse_moe.experts.3.w3." in k for k in on_disk)
    par = validate_parallelism(shape, gpus=1)
    init_model_parallel(par)
    model = build_gpt_model(shape, par, dtype=torch.float32).eval()
    load_hf_weights(model, on_disk, shape, par)

    ids = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = forward_logits(model, ids, shape)
        theirs = reference(input_ids=ids).logits
    assert float((ours - theirs).abs().max()) < 1e-4, float((ours - theirs).abs().max())

    exported = export_hf_weights(model, shape, par)
    assert sorted(exported) == sorted(on_disk)
    for key, tensor in on_disk.items():
        assert torch.equal(exported[key], tensor), key

    counted = stage_param_counts(shape, tp=1, pp=1).total
    padding = (model.embedding.word_embeddings.weight.shape[0] - shape.vocab_size) * shape.hidden_size * 2
    assert counted == sum(p.numel() for p in unwrap(model).parameters()) - padding


def test_a_mixtral_with_a_sliding_window_or_router_noise_is_refused() -> None:
    config = {
        **COMMON,
        **FAMILIES["mixtral"],
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "rope_theta": 1e6,
    }
    with pytest.raises(UnsupportedModelError, match="MixtralForCausalLM with sliding_window"):
        model_shape({**config, "sliding_window": 4096})
    with pytest.raises(ValueError, match=r"router_jitter_noise 0\.1 "):
        model_shape({**config, "router_jitter_noise": 0.1})
