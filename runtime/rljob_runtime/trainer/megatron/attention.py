"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``: a drop-in replacement for
megatron-core 0.16.1's ``DotProductAttention`` (the local spec's core attention, which materialises the
s x s scores and their fp32 softmax). On an H100/H200 in bf16, SDPA runs FlashAttention-2 or cuDNN's
fused attention (O(s) memory, no score matrix); elsewhere it falls back to torch's own kernels.

Same constructor and forward signatures as ``DotProductAttention``; the layer spec swaps it in as
``self_attention.submodules.core_attention`` (``model.build_gpt_model(attention="sdpa")``).
Packed sequences (``packed_seq_params`` with qkv_format "thd", training.dynamicBatch): query [t, np, hn]
and key/value [t, ng, hn] hold several sequences end to end, bounded by ``cu_seqlens``; each attends
causally to itself only. On CUDA in fp16/bf16 that is one ``torch.nn.attention.varlen.varlen_attn``
call (FlashAttention's varlen kernel, torch >= 2.10; its keyword for causal attention changed between
releases, so it is read from the signature); elsewhere (CPU, fp32, an older torch) one SDPA call per
sequence.

What it does not do (attention bias, explicit non-causal masks, dropout, sliding windows, softmax
offsets, context parallelism, QK-clip, packed sequences padded for CP) it refuses by name instead of
computing something else.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import is_layer_window_attention
from megatron.core.utils import divide
from torch.torch_version import TorchVersion

# ``enable_gqa`` arrived in torch 2.5.
SDPA_HAS_ENABLE_GQA = TorchVersion(torch.__version__) >= "2.5"


def native_gqa(query: torch.Tensor) -> bool:
    """Let SDPA broadcast the KV heads itself (``enable_gqa``) instead of copying them per query head.

    Only where the kernel that runs takes GQA natively: FlashAttention-2 and cuDNN do (CUDA, fp16/bf16),
    but on some torch versions the memory-efficient kernel (the CUDA fp32 path) refuses ``enable_gqa``
    and SDPA would drop to the math kernel, which builds the s x s scores; there (and on CPU) repeating
    K/V is the cheaper way and the same one ``DotProductAttention`` takes.
    """
    return SDPA_HAS_ENABLE_GQA and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)


@functools.cache
def _varlen_attn() -> tuple[Callable[..., torch.Tensor], frozenset[str]] | None:
    """torch's varlen attention and its keyword names, or None where torch has none that can be told
    to be causal (``window_size=(-1, 0)`` in recent releases, ``is_causal`` in the first)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = frozenset(inspect.signature(varlen_attn).parameters)
    if not params & {"window_size", "is_causal"}:
        return None
    fn: Callable[..., torch.Tensor] = varlen_attn  # type: ignore[assignment]  # without return_aux: a tensor
    return fn, params


def varlen_causal(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
) -> torch.Tensor | None:
    """Causal attention of each packed sequence with the varlen kernel ([t, heads, hn] in and out), or
    None where it does not run (CPU, fp32, no usable ``varlen_attn``, a scale it cannot take)."""
    found = _varlen_attn()
    if found is None or not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16):
        return None
    fn, params = found
    kwargs: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kwargs["scale"] = scale
    elif not math.isclose(scale, 1.0 / math.sqrt(query.size(-1))):
        return None
    if key.size(1) != query.size(1):
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            key, value = _repeat_kv(key, value, query.size(1), dim=1)
    cu = cu_seqlens.to(device=query.device, dtype=torch.int32)
    return fn(query, key, value, cu, cu, max_seqlen, max_seqlen, **kwargs)


def _repeat_kv(
    key: torch.Tensor, value: torch.Tensor, heads: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV groups repeated for their query heads: query head i reads group i // (heads / groups), as
    DotProductAttention's repeat."""
    groups = key.size(dim)
    return key.repeat_interleave(heads // groups, dim=dim), value.repeat_interleave(heads // groups, dim=dim)


class SdpaAttention(MegatronModule):
    """Causal self-attention of one TP partition with ``F.scaled_dot_product_attention``.

    Shapes: query [sq, b, np, hn], key/value [sk, b, ng, hn] (np, ng: this partition's query heads
    and KV groups), output [sq, b, np * hn], as ``DotProductAttention``.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        self.config: TransformerConfig = config
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type

        if config.context_parallel_size != 1:
            raise NotImplementedError(
                f"SdpaAttention: context parallelism (context_parallel_size="
                f"{config.context_parallel_size}) needs ring attention over the CP group; use cp=1"
            )
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout != 0.0:
            raise NotImplementedError(
                f"SdpaAttention: attention dropout {dropout} (the TP-aware RNG of DotProductAttention's "
                "dropout is not reproduced); set attention_dropout=0"
            )
        if config.softmax_type != "vanilla":
            raise NotImplementedError(f"SdpaAttention: softmax_type={config.softmax_type!r}")
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
            raise NotImplementedError(
                f"SdpaAttention: sliding-window attention (window_size={config.window_size})"
            )
        if config.qk_clip or config.log_max_attention_logit:
            raise NotImplementedError(
                "SdpaAttention: qk_clip / log_max_attention_logit (they read the max attention logit, "
                "which fused SDPA kernels do not return)"
            )

        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        world_size = pg_collection.tp.size()
        projection_size = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection_size, world_size)
        self.hidden_size_per_attention_head = divide(projection_size, config.num_attention_heads)
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, world_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, world_size)

        # The scale DotProductAttention applies in the end: it multiplies the scores by
        # softmax_scale / layer_number when apply_query_key_layer_scaling is on and its softmax
        # multiplies them back by layer_number (in fp32, which that option forces), so layer scaling
        # only guards fp16 overflow of the materialised scores; SDPA's fused kernels keep the scores
        # in fp32 registers, so the net scale is all that matters.
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head)
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        """[sq, b, np, hn] queries, [sk, b, ng, hn] keys/values -> [sq, b, np * hn]; packed: [t, np, hn],
        [t, ng, hn] -> [t, np * hn]."""
        if attention_bias is not None:
            raise NotImplementedError("SdpaAttention: attention_bias")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        if packed_seq_params is not None:
            return self._packed(query, key, value, attention_mask, mask_type, packed_seq_params)
        sq, b, np_, hn = query.shape
        sk = key.size(0)
        if mask_type == AttnMaskType.causal:
            if sq != sk:
                raise NotImplementedError(
                    f"SdpaAttention: causal attention with {sq} queries over {sk} keys (KV-cache "
                    "inference); SDPA's is_causal aligns the mask top-left, Megatron's is square"
                )
            # The mask is not read: with a causal layer our callers pass causal_mask(s) (model.py),
            # which is exactly is_causal, and right-padded batches need nothing more (real tokens
            # come first, so no real token sees padding; padded positions are not trained on).
            # Passing it to SDPA would rule out the flash/cuDNN kernels (they take no mask).
            is_causal = True
        elif mask_type == AttnMaskType.no_mask and attention_mask is None:
            is_causal = False
        else:
            raise NotImplementedError(
                f"SdpaAttention: attention mask type {mask_type.name} "
                f"{'with' if attention_mask is not None else 'without'} a mask (only causal, or "
                "no_mask without a mask, are supported)"
            )
        if np_ != self.num_attention_heads_per_partition or hn != self.hidden_size_per_attention_head:
            raise ValueError(
                f"SdpaAttention: query heads x head dim {np_} x {hn}, expected "
                f"{self.num_attention_heads_per_partition} x {self.hidden_size_per_attention_head}"
            )

        # [s, b, heads, hn] -> [b, heads, s, hn]: views (last dim stays contiguous, which is all the
        # flash/cuDNN kernels ask of the strides).
        out = self._sdpa(
            query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3), is_causal
        )
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return out.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
        """SDPA of [b, np, s, hn] queries over [b, ng, s, hn] keys/values."""
        kwargs: dict[str, Any] = {}
        if k.size(1) != q.size(1):
            if native_gqa(q):
                kwargs["enable_gqa"] = True
            else:
                k, v = _repeat_kv(k, v, q.size(1), dim=1)
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=0.0, is_causal=is_causal, scale=self.softmax_scale, **kwargs
        )

    def _packed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        mask_type: AttnMaskType,
        params: PackedSeqParams,
    ) -> torch.Tensor:
        """Causal attention within each packed sequence: [t, np, hn] queries -> [t, np * hn]."""
        if params.qkv_format != "thd":
            raise NotImplementedError(f"SdpaAttention: packed qkv_format {params.qkv_format!r} (only 'thd')")
        if mask_type != AttnMaskType.causal or attention_mask is not None:
            raise NotImplementedError(
                f"SdpaAttention: packed sequences with attention mask type {mask_type.name}"
                f"{' and a mask' if attention_mask is not None else ''} (only causal, without a mask)"
            )
        cu = params.cu_seqlens_q
        padded = (params.cu_seqlens_q_padded, params.cu_seqlens_kv_padded)
        if any(p is not None and not torch.equal(p, cu) for p in padded) or not torch.equal(
            params.cu_seqlens_kv, cu
        ):
            raise NotImplementedError(
                "SdpaAttention: packed sequences whose key bounds or padded bounds differ from the query "
                "bounds (cross-attention, context-parallel padding)"
            )
        t, np_, hn = query.shape
        out = varlen_causal(query, key, value, cu, int(params.max_seqlen_q), self.softmax_scale)
        if out is None:
            bounds = cu.tolist()
            parts = []
            for start, end in itertools.pairwise(bounds):
                # [n, heads, hn] -> [1, heads, n, hn]
                q, k, v = (x[start:end].transpose(0, 1)[None] for x in (query, key, value))
                parts.append(self._sdpa(q, k, v, is_causal=True)[0].transpose(0, 1))
            out = torch.cat(parts)
        return out.reshape(t, np_ * hn)
