"""HF <-> Megatron conversion and TP/PP sharding: pure tensor functions, real shapes, CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rljob_runtime.trainer.megatron import model_shape, padded_vocab_size
from rljob_runtime.trainer.megatron.arch import ModelShape
from rljob_runtime.trainer.megatron.convert import (
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    split_qkv,
)
from rljob_runtime.trainer.megatron.shard import (
    from_stage,
    gather_tp,
    shard_tensor,
    shard_tp,
    stage_layers,
    to_stage,
)
from rljob_runtime.trainer.megatron.testing import (
    LLAMA_UNTIED,
    QWEN2_0_5B,
    QWEN3_0_6B,
    SMOLLM2_135M,
    hf_shapes,
    random_hf_state,
    with_layers,
)

# Real per-layer shapes; 2-4 layers, and for Qwen a smaller vocab that needs padding (151,936 x 1,024
# fp32 would be 622 MB per tensor), keep the random tensors small on a 2-core CI machine.
CASES = {
    "smollm2": with_layers(SMOLLM2_135M, 2),
    "qwen3": with_layers(QWEN3_0_6B, 2, vocab_size=1000),
    "qwen2": with_layers(QWEN2_0_5B, 2, vocab_size=1500),
    "llama-untied": LLAMA_UNTIED,
}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


def _meta_state(shape: ModelShape) -> dict[str, torch.Tensor]:
    return {n: torch.empty(s, device="meta") for n, s in hf_shapes(shape).items()}


@pytest.mark.parametrize(
    "config", [SMOLLM2_135M, QWEN3_0_6B, QWEN2_0_5B, LLAMA_UNTIED], ids=lambda c: c["model_type"]
)
def test_full_model_names_and_shapes(config: dict[str, Any]) -> None:
    """Every layer of the real configs converts (meta tensors: shapes only) and back."""
    shape = model_shape(config)
    padded = padded_vocab_size(shape.vocab_size, 1)
    mg = hf_to_megatron(_meta_state(shape), shape, padded)
    per_layer = 6 + (1 if shape.qkv_bias else 0) + (2 if shape.qk_norm else 0)
    assert len(mg) == 2 + per_layer * shape.num_layers + (0 if shape.tied_embeddings else 1)
    last = f"decoder.layers.{shape.num_layers - 1}."
    assert mg[last + "self_attention.linear_qkv.weight"].shape == (
        shape.q_size + 2 * shape.kv_size,
        shape.hidden_size,
    )
    assert mg[last + "mlp.linear_fc1.weight"].shape == (2 * shape.ffn_hidden_size, shape.hidden_size)
    assert mg["embedding.word_embeddings.weight"].shape == (padded, shape.hidden_size)
    back = megatron_to_hf(mg, shape)
    assert {n: tuple(t.shape) for n, t in back.items()} == hf_shapes(shape)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(name: str, dtype: torch.dtype) -> None:
    shape = model_shape(CASES[name])
    hf = random_hf_state(shape, dtype=dtype, seed=1)
    for tp in (1, 2):
        mg = hf_to_megatron(hf, shape, padded_vocab_size(shape.vocab_size, tp))
        _same(megatron_to_hf(mg, shape), hf)


def test_tied_lm_head_alias_is_ignored_and_can_be_emitted() -> None:
    shape = model_shape(CASES["smollm2"])
    hf = random_hf_state(shape, seed=2)
    with_alias = {**hf, "lm_head.weight": hf["model.embed_tokens.weight"]}
    mg = hf_to_megatron(with_alias, shape, shape.vocab_size)
    assert "output_layer.weight" not in mg
    back = megatron_to_hf(mg, shape, include_tied_lm_head=True)
    assert torch.equal(back["lm_head.weight"], hf["model.embed_tokens.weight"])


def test_vocab_padding_is_zero_rows_and_stripped() -> None:
    shape = model_shape(LLAMA_UNTIED)  # vocab 32003
    assert padded_vocab_size(32003, 1) == 32128
    assert padded_vocab_size(32003, 2) == 32256
    assert padded_vocab_size(151936, 2) == 152064
    assert padded_vocab_size(49152, 2) == 49152
    hf = random_hf_state(shape, seed=3)
    mg = hf_to_megatron(hf, shape, 32256)
    for name, src in (
        ("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
        ("output_layer.weight", "lm_head.weight"),
    ):
        assert mg[name].shape[0] == 32256
        assert torch.equal(mg[name][:32003], hf[src])
        assert not mg[name][32003:].any()


def test_qkv_layout_matches_megatron_grouping() -> None:
    """4 query heads, 2 KV heads, head_dim 1: Megatron wants [q0 q1 k0 v0 | q2 q3 k1 v1]."""
    shape = ModelShape("LlamaForCausalLM", 1, 3, 4, 2, 1, 4, 8, True, False, False, 1e4, 1e-6, 16)
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    fused = fuse_qkv(q, k, v, shape)
    assert fused.flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    assert [t.flatten().tolist() for t in split_qkv(fused, shape)] == [[10, 11, 12, 13], [20, 21], [30, 31]]
    # Biases ([out]) use the same layout.
    assert fuse_qkv(q.flatten(), k.flatten(), v.flatten(), shape).tolist() == [10, 11, 20, 30, 12, 13, 21, 31]


def test_qkv_layout_with_head_dim_two_and_multi_column_weights() -> None:
    shape = ModelShape("LlamaForCausalLM", 1, 2, 2, 1, 2, 4, 8, True, False, False, 1e4, 1e-6, 16)
    q = torch.arange(8.0).reshape(4, 2)  # 2 heads x head_dim 2 rows, 2 input columns
    k = 100 + torch.arange(4.0).reshape(2, 2)
    v = 200 + torch.arange(4.0).reshape(2, 2)
    fused = fuse_qkv(q, k, v, shape)
    assert torch.equal(fused, torch.cat([q, k, v]))  # one group: q heads then k then v


def test_tp_split_of_fused_tensors() -> None:
    """Rank r of TP 2 holds [gate_r; up_r] for fc1, whole KV groups of the fused qkv, a dim-1 slice of
    row-parallel weights and a vocab slice of the embedding."""
    shape = model_shape(with_layers(QWEN3_0_6B, 1, vocab_size=1000))
    hf = random_hf_state(shape, seed=4)
    mg = hf_to_megatron(hf, shape, padded_vocab_size(shape.vocab_size, 2))
    p = "decoder.layers.0."
    rank1 = shard_tp(mg, 2, 1)
    f = shape.ffn_hidden_size
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(rank1[p + "mlp.linear_fc1.weight"], torch.cat([gate[f // 2 :], up[f // 2 :]]))
    d, g = shape.head_dim, shape.num_kv_heads
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    per_group = shape.heads_per_group * d
    expected = torch.cat(
        [
            torch.cat(
                [q[j * per_group : (j + 1) * per_group], k[j * d : (j + 1) * d], v[j * d : (j + 1) * d]]
            )
            for j in range(g // 2, g)
        ]
    )
    assert torch.equal(rank1[p + "self_attention.linear_qkv.weight"], expected)
    o = hf["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(rank1[p + "self_attention.linear_proj.weight"], o[:, shape.q_size // 2 :])
    assert torch.equal(
        rank1[p + "self_attention.q_layernorm.weight"], hf["model.layers.0.self_attn.q_norm.weight"]
    )
    emb = rank1["embedding.word_embeddings.weight"]
    assert emb.shape[0] == padded_vocab_size(shape.vocab_size, 2) // 2


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_split_then_gather_is_identity(name: str, tp: int) -> None:
    shape = model_shape(CASES[name])
    mg = hf_to_megatron(random_hf_state(shape, seed=5), shape, padded_vocab_size(shape.vocab_size, tp))
    shards = [shard_tp(mg, tp, r) for r in range(tp)]
    for shard in shards:
        assert shard["decoder.final_layernorm.weight"] is mg["decoder.final_layernorm.weight"]
    _same(gather_tp(shards), mg)


def test_tp_split_refuses_what_does_not_divide() -> None:
    with pytest.raises(ValueError, match="does not split over 2 TP ranks"):
        shard_tensor("decoder.layers.0.mlp.linear_fc2.weight", torch.zeros(4, 3), 2, 0)
    with pytest.raises(KeyError, match="unknown Megatron tensor"):
        shard_tensor("decoder.layers.0.mystery.weight", torch.zeros(4), 2, 0)


@pytest.mark.parametrize("name", ["smollm2", "llama-untied"])
def test_pipeline_stages_round_trip(name: str) -> None:
    shape = model_shape(with_layers(CASES[name], 4))
    mg = hf_to_megatron(random_hf_state(shape, seed=6), shape, padded_vocab_size(shape.vocab_size, 1))
    assert list(stage_layers(4, 2, 1)) == [2, 3]
    stages = [to_stage(mg, shape, 2, s) for s in range(2)]
    assert "embedding.word_embeddings.weight" in stages[0]
    assert "embedding.word_embeddings.weight" not in stages[1]
    assert "decoder.final_layernorm.weight" in stages[1]
    assert torch.equal(
        stages[1]["decoder.layers.0.input_layernorm.weight"], mg["decoder.layers.2.input_layernorm.weight"]
    )
    assert not any(k.startswith("decoder.layers.2.") for k in stages[1])
    # The last stage of a tied model holds the output layer as a copy of the embedding.
    assert ("output_layer.weight" in stages[1]) and ("output_layer.weight" not in stages[0])
    if shape.tied_embeddings:
        assert torch.equal(stages[1]["output_layer.weight"], mg["embedding.word_embeddings.weight"])
    merged: dict[str, torch.Tensor] = {}
    for s, stage in enumerate(stages):
        merged.update(from_stage(stage, shape, 2, s))
    _same(merged, mg)
    # Per-stage HF export, merged, is the original HF model.
    hf = megatron_to_hf(mg, shape)
    by_stage: dict[str, torch.Tensor] = {}
    for s, stage in enumerate(stages):
        by_stage.update(megatron_to_hf(from_stage(stage, shape, 2, s), shape))
    _same(by_stage, hf)


def test_hf_names_match_transformers() -> None:
    """Our HF name/shape table equals transformers' own models (built on the meta device)."""
    transformers = pytest.importorskip("transformers")
    for config in (
        with_layers(SMOLLM2_135M, 2),
        with_layers(QWEN3_0_6B, 2),
        with_layers(QWEN2_0_5B, 2),
        with_layers(LLAMA_UNTIED, 2),
    ):
        cfg_cls = transformers.AutoConfig.for_model(config["model_type"]).__class__
        fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
        hf_config = cfg_cls(**fields)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config)
        names = {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied lm_head is not listed
        assert names == hf_shapes(model_shape(hf_config)), config["model_type"]
