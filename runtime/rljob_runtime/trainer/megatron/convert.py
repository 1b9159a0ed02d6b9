"""HF <-> Megatron GPTModel state dicts (local layer spec), pure tensor functions.

The Megatron side here is the *whole* model as one TP=1, PP=1 rank sees it (global layer indices,
vocab padded); ``shard`` splits it per TP rank and PP stage. Names (megatron-core 0.16.1,
``get_gpt_layer_local_spec``)::

    embedding.word_embeddings.weight                      [V_pad, h]    <- model.embed_tokens
    decoder.layers.N.input_layernorm.weight               [h]           <- input_layernorm
    decoder.layers.N.self_attention.linear_qkv.weight     [(nq+2*nkv)*d, h] <- q/k/v_proj, interleaved
    decoder.layers.N.self_attention.linear_qkv.bias       (Qwen2)
    decoder.layers.N.self_attention.q_layernorm.weight    [d]  (Qwen3)  <- q_norm
    decoder.layers.N.self_attention.k_layernorm.weight    [d]  (Qwen3)  <- k_norm
    decoder.layers.N.self_attention.linear_proj.weight    [h, nq*d]     <- o_proj
    decoder.layers.N.pre_mlp_layernorm.weight             [h]           <- post_attention_layernorm
    decoder.layers.N.mlp.linear_fc1.weight                [2*f, h]      <- [gate_proj; up_proj]
    decoder.layers.N.mlp.linear_fc2.weight                [h, f]        <- down_proj
    decoder.final_layernorm.weight                        [h]           <- model.norm
    output_layer.weight                                   [V_pad, h]    <- lm_head (untied only)

Megatron's fused qkv is grouped per key/value head: for each of the nkv groups, that group's
nq/nkv query heads, then its key head, then its value head (``SelfAttention.
get_query_key_value_tensors`` views the output as [ng, (nq/ng + 2) * d]).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .arch import ModelShape
from .moe import MoEShape, hf_to_megatron_moe, megatron_moe_to_hf

Tensors = dict[str, torch.Tensor]

HF_LAYER = "model.layers.{}."
MG_LAYER = "decoder.layers.{}."

# Per-layer tensors that map one-to-one (HF suffix, Megatron suffix).
_DIRECT = (
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
    ("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
)
_QK_NORM = (
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
)


# ------------------------------------------------------------------------------ fused tensors


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """HF q/k/v projections (weights [out, h] or biases [out]) -> Megatron's grouped [q.., k, v] layout."""
    g, d, rest = shape.num_kv_heads, shape.head_dim, q.shape[1:]
    parts = (
        q.reshape(g, shape.heads_per_group * d, *rest),
        k.reshape(g, d, *rest),
        v.reshape(g, d, *rest),
    )
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of ``fuse_qkv``."""
    g, d, rest = shape.num_kv_heads, shape.head_dim, qkv.shape[1:]
    grouped = qkv.reshape(g, (shape.heads_per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [shape.heads_per_group * d, d, d], dim=1)
    return (
        q.reshape(shape.q_size, *rest).contiguous(),
        k.reshape(shape.kv_size, *rest).contiguous(),
        v.reshape(shape.kv_size, *rest).contiguous(),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's fc1 is [gate; up] along the output dim (Megatron chunks the output in two, silu on the first)."""
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.contiguous(), up.contiguous()


def pad_vocab(weight: torch.Tensor, padded: int) -> torch.Tensor:
    """[V, h] -> [padded, h] with zero rows (never predicted: the backend strips their logits)."""
    extra = padded - weight.shape[0]
    if extra < 0:
        raise ValueError(f"padded vocab {padded} is smaller than the vocab {weight.shape[0]}")
    if extra == 0:
        return weight
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])], dim=0)


# ------------------------------------------------------------------------------ whole models


def _take(state: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return state[name]
    except KeyError:
        raise KeyError(f"missing weight {name!r}") from None


def hf_to_megatron(
    hf: Mapping[str, torch.Tensor], shape: ModelShape, padded_vocab: int, moe: MoEShape | None = None
) -> Tensors:
    """An HF state dict -> the whole Megatron model's (TP=1, PP=1). ``lm_head.weight`` is ignored when
    the embeddings are tied (transformers' state_dict carries it as an alias). ``moe``: the MoE layers'
    MLP is their router and experts (``moe.py``)."""
    out: Tensors = {
        "embedding.word_embeddings.weight": pad_vocab(_take(hf, "model.embed_tokens.weight"), padded_vocab)
    }
    for i in range(shape.num_layers):
        src, dst = HF_LAYER.format(i), MG_LAYER.format(i)
        sparse = moe is not None and moe.is_moe(i)
        for hf_name, mg_name in _DIRECT + (_QK_NORM if shape.qk_norm else ()):
            if not (sparse and hf_name.startswith("mlp.")):
                out[dst + mg_name] = _take(hf, src + hf_name)
        attn = src + "self_attn."
        q, k, v = (_take(hf, f"{attn}{p}_proj.weight") for p in "qkv")
        out[dst + "self_attention.linear_qkv.weight"] = fuse_qkv(q, k, v, shape)
        if shape.qkv_bias:
            qb, kb, vb = (_take(hf, f"{attn}{p}_proj.bias") for p in "qkv")
            out[dst + "self_attention.linear_qkv.bias"] = fuse_qkv(qb, kb, vb, shape)
        if sparse:
            assert moe is not None
            out.update(hf_to_megatron_moe(hf, moe, i))
            continue
        gate, up = _take(hf, src + "mlp.gate_proj.weight"), _take(hf, src + "mlp.up_proj.weight")
        out[dst + "mlp.linear_fc1.weight"] = fuse_gate_up(gate, up)
    out["decoder.final_layernorm.weight"] = _take(hf, "model.norm.weight")
    if not shape.tied_embeddings:
        out["output_layer.weight"] = pad_vocab(_take(hf, "lm_head.weight"), padded_vocab)
    return out


def megatron_layer_to_hf(layer: int, suffix: str, tensor: torch.Tensor, shape: ModelShape) -> Tensors:
    """One Megatron per-layer tensor (``suffix`` after ``decoder.layers.N.``) -> its HF tensors."""
    dst = HF_LAYER.format(layer)
    for hf_name, mg_name in _DIRECT + _QK_NORM:
        if suffix == mg_name:
            return {dst + hf_name: tensor}
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = split_qkv(tensor, shape)
        return {f"{dst}self_attn.{p}_proj.{kind}": t for p, t in zip("qkv", (q, k, v), strict=True)}
    if suffix == "mlp.linear_fc1.weight":
        gate, up = split_gate_up(tensor)
        return {dst + "mlp.gate_proj.weight": gate, dst + "mlp.up_proj.weight": up}
    if shape.moe is not None:  # an MoE layer (moe.py); expert indices global (shard_experts' inverse)
        converted = megatron_moe_to_hf(layer, suffix, tensor, shape.moe)
        if converted is not None:
            return converted
    raise KeyError(f"unknown Megatron layer tensor {suffix!r}")


def megatron_to_hf(
    mg: Mapping[str, torch.Tensor], shape: ModelShape, include_tied_lm_head: bool = False
) -> Tensors:
    """Inverse of ``hf_to_megatron``: split qkv and gate/up, strip vocab padding. Accepts any subset of
    the model (e.g. one pipeline stage, with global layer indices). ``include_tied_lm_head``: also emit
    ``lm_head.weight`` (= the embedding) for tied models, for consumers that want every name."""
    out: Tensors = {}
    for name, tensor in mg.items():
        if name.startswith("decoder.layers."):
            index, suffix = name[len("decoder.layers.") :].split(".", 1)
            out.update(megatron_layer_to_hf(int(index), suffix, tensor, shape))
        elif name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor[: shape.vocab_size]
            if shape.tied_embeddings and include_tied_lm_head:
                out["lm_head.weight"] = out["model.embed_tokens.weight"]
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        elif name == "output_layer.weight":
            if not shape.tied_embeddings:  # a tied model's last PP stage holds a copy of the embedding
                out["lm_head.weight"] = tensor[: shape.vocab_size]
        elif not name.endswith("._extra_state"):
            raise KeyError(f"unknown Megatron tensor {name!r}")
    return out
