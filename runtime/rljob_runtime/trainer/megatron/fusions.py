"""Opt-in fusions for megatron-core 0.16.1's local layer spec that run on plain torch (no apex, no
TransformerEngine), where megatron-core would otherwise run unfused code:

- ``wgrad``: gradient-accumulation fusion. ``WGRAD`` stands in for apex's
  ``fused_weight_gradient_mlp_cuda`` (``install_wgrad_fusion``): each linear's weight gradient is
  accumulated by its GEMM straight into Megatron DDP's ``main_grad`` (fp32) instead of a bf16 ``.grad``
  that DDP's hook then adds (one kernel and a weight-sized temporary fewer per linear and micro-batch).
- ``norm``: ``FusedRMSNorm``, the local spec's ``WrappedTorchNorm`` (``torch.nn.RMSNorm``) as one
  ``torch.compile``d kernel each way (torch's own fused kernel refuses the fp32 weight with bf16 input).
- ``rope``: ``install_rope_fusion`` swaps ``rope_utils._apply_rotary_pos_emb_bshd`` for a compiled copy
  of itself (process-wide: every model's RoPE).
- ``use_fused_adam``: the torch AdamW under Megatron's optimizer with ``fused=True`` (one kernel per
  dtype/device group, no foreach temporaries).

The compiled pieces compile on first use with ``dynamic=None``: inputs are flattened to a few layouts
(views, no copies) and their token dims marked dynamic up front (``_graph_input``), so new RL batch
shapes reuse the graphs. Graphs per process: the norm one per (width, row stride) -- hidden, q, k --
and the RoPE at most one per q/k layout, each once with and once without grad (no-grad forwards: log-probs,
the reference model, full recompute), within dynamo's recompile limit of 8 per function.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.tensor_parallel import layers as tp_layers
from megatron.core.utils import make_viewless_tensor

from rljob_api.spec_training import MEGATRON_FUSIONS

from .norms import RMSNorm

# "swiglu" is megatron-core's own (bias_activation_fusion, torch.compile'd); the rest live here. The
# names are the API's (training.fusions), so the CRD admits exactly what is built.
FUSIONS = frozenset(MEGATRON_FUSIONS)


def check_fusions(fusions: Iterable[str]) -> frozenset[str]:
    """``fusions`` as a frozenset, unknown names refused."""
    chosen = frozenset(fusions)
    if unknown := sorted(chosen - FUSIONS):
        raise ValueError(f"unknown fusion(s) {unknown}; choose from {sorted(FUSIONS)}")
    return chosen


# ----------------------------------------------------------------------- gradient accumulation

# Whether CUDA's addmm takes a fp32 accumulator with bf16/fp16 factors (aten::addmm.dtype_out): torch
# with pytorch#167931 (Nov 2025) does, older refuses ("self and mat2 must have the same dtype"); learnt
# on the first call.
_MIXED_ADDMM: dict[str, bool] = {"ok": True}


def wgrad_accumulate(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad += grad_output.T @ total_input``: [tokens, in], [tokens, out] -> [out, in], in place.

    Apex's contract (megatron-core calls ``wgrad_gemm_accum_fp32(total_input, grad_output, main_grad)``,
    2-D contiguous factors). Same dtype: one in-place GEMM with beta = 1. bf16/fp16 factors into a fp32
    accumulator: on CUDA one GEMM with a fp32 epilogue (no bf16 rounding of the weight gradient, as
    apex); elsewhere, or where torch refuses it, the product in the factors' dtype then added, which is
    exactly what the unfused path (bf16 ``.grad`` + DDP's ``main_grad.add_``) computes.
    """
    if total_input.dtype == main_grad.dtype:
        main_grad.addmm_(grad_output.t(), total_input)
        return
    if main_grad.is_cuda and _MIXED_ADDMM["ok"]:
        try:
            torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=main_grad.dtype, out=main_grad)
            return
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError) as err:  # checked before any work: main_grad is untouched
            _MIXED_ADDMM["ok"] = False
            warnings.warn(
                f"addmm with out_dtype={main_grad.dtype} refused ({str(err).splitlines()[0]}); "
                "wgrad fusion falls back to a separate add",
                stacklevel=2,
            )
    main_grad.add_(grad_output.t().mm(total_input))


# The module object megatron-core's layers.py calls (fp16 covers bf16 main grads too).
WGRAD = SimpleNamespace(wgrad_gemm_accum_fp32=wgrad_accumulate, wgrad_gemm_accum_fp16=wgrad_accumulate)


def install_wgrad_fusion() -> None:
    """Let ``TransformerConfig(gradient_accumulation_fusion=True)`` build and run without apex.

    layers.py imports apex's extension at import time into two globals: ``_grad_accum_fusion_available``
    (ColumnParallelLinear refuses the flag without it) and ``fused_weight_gradient_mlp_cuda`` (called in
    backward). Idempotent; a real apex extension, if present, is kept. Only models whose config sets
    the flag are affected, and they must run backward under Megatron DDP (it creates ``main_grad``).
    """
    if tp_layers._grad_accum_fusion_available:
        return
    tp_layers.fused_weight_gradient_mlp_cuda = WGRAD
    tp_layers._grad_accum_fusion_available = True


def uninstall_wgrad_fusion() -> None:
    """Undo ``install_wgrad_fusion`` (tests); leaves a real apex extension alone."""
    if getattr(tp_layers, "fused_weight_gradient_mlp_cuda", None) is WGRAD:
        del tp_layers.fused_weight_gradient_mlp_cuda
        tp_layers._grad_accum_fusion_available = False


# ------------------------------------------------------------------------------ compiled pieces


def _graph_input(tensor: torch.Tensor, *dims: int) -> torch.Tensor:
    """``tensor`` for a compiled function: ``dims`` marked dynamic before the first compile, so tensors
    differing only there (RL batches of new lengths, micro-batch sizes, q vs k head counts) share one
    graph instead of recompiling until automatic dynamic shapes kick in; the other dims (hidden size,
    head_dim) stay static, so reduction sizes are compile-time constants (``maybe_``: sizes 0/1 stay
    specialised without raising). Made viewless (megatron's autograd-preserving helper): dynamo
    guards a view on its base's sizes too, and q/k are views of the qkv projection output."""
    tensor = make_viewless_tensor(tensor, requires_grad=tensor.requires_grad, keep_graph=True)
    for dim in dims:
        torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return tensor


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # torch.nn.RMSNorm's math, all in fp32 and one rounding to x's dtype at the end (torch rounds the
    # normalised x to bf16 before multiplying by the fp32 weight: a 1-ulp difference at most).
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


@functools.cache
def _compiled_rms_norm() -> Callable[..., torch.Tensor]:
    return torch.compile(_rms_norm, dynamic=None)


class FusedRMSNorm(RMSNorm):
    """``norms.RMSNorm`` (the local spec's ``WrappedTorchNorm`` with the constructor megatron calls,
    one fp32 ``weight`` of shape [hidden_size] initialised to ones like ``torch.nn.RMSNorm``'s, so
    state-dict names, dtypes and ``convert.py`` are unchanged, marked for sequence parallelism) with a
    forward of one compiled kernel (backward: inductor's dx and dweight reductions)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., h] -> [tokens, h]: a view for Megatron's inputs, including k (a strided slice of the
        # qkv projection), so sequence, batch and head counts are one dynamic dim.
        rows = _graph_input(x.reshape(-1, x.shape[-1]), 0)
        return _compiled_rms_norm()(rows, self.weight, self.eps).view(x.shape)


# The original, captured at import: what install_rope_fusion compiles and uninstall puts back.
_ROPE_BSHD = rope_utils._apply_rotary_pos_emb_bshd


@functools.cache
def _compiled_rope() -> Callable[..., torch.Tensor]:
    # The very function megatron-core runs, compiled: identical semantics by construction (bf16 inputs
    # are computed in fp32 inside the kernel and rounded once, where eager rounds after each op).
    return torch.compile(_ROPE_BSHD, dynamic=None)


def fused_rope_bshd(
    t: torch.Tensor,
    freqs: torch.Tensor,
    rotary_interleaved: bool = False,
    multi_latent_attention: bool = False,
    mscale: float = 1.0,
) -> torch.Tensor:
    """``rope_utils._apply_rotary_pos_emb_bshd`` (t [s, b, heads, d], freqs [s, 1, 1, d_rot]), compiled:
    one kernel for cos/sin, the rotation and the pass-through columns, reading strided q/k in place."""
    if rotary_interleaved or multi_latent_attention:  # would compile, but untested here: refuse
        raise NotImplementedError("fused RoPE: rotary_interleaved / multi_latent_attention")
    if t.dim() != 4 or freqs.dim() != 4 or freqs.shape[1:3] != (1, 1):  # e.g. mRoPE's [s, b, 1, d]
        raise NotImplementedError(f"fused RoPE: t {tuple(t.shape)}, freqs {tuple(freqs.shape)}")
    # [s, b, heads, d] -> [s, b * heads, d]: a view for q and k (slices of the qkv projection), so the
    # batch size and head count are one dynamic dim; the frequencies broadcast over it as before.
    rows = _graph_input(t.flatten(1, 2), 0, 1)
    out = _compiled_rope()(rows, _graph_input(freqs.flatten(1, 2), 0), mscale=mscale)
    return out.view(t.shape)


def install_rope_fusion() -> None:
    """Route megatron-core's unfused RoPE through ``fused_rope_bshd``. ``apply_rotary_pos_emb`` (and
    the packed-sequence path) look ``_apply_rotary_pos_emb_bshd`` up in rope_utils' globals at every
    call, so patching the module is enough. Process-wide and idempotent."""
    rope_utils._apply_rotary_pos_emb_bshd = fused_rope_bshd


def uninstall_rope_fusion() -> None:
    rope_utils._apply_rotary_pos_emb_bshd = _ROPE_BSHD


def rope_fusion_installed() -> bool:
    return rope_utils._apply_rotary_pos_emb_bshd is fused_rope_bshd


# ---------------------------------------------------------------------------------- fused Adam


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside what ``get_megatron_optimizer`` returns: a ChainedOptimizer's
    members, each a DistributedOptimizer / Float16OptimizerWithFloat16Params / FP32Optimizer holding
    one in ``.optimizer`` (None on a rank without parameters)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    members = getattr(optimizer, "chained_optimizers", None)
    if members is not None:  # before .optimizer: ChainedOptimizer.optimizer asserts a single member
        return [opt for member in members for opt in torch_optimizers(member)]
    inner = getattr(optimizer, "optimizer", None)
    return [] if inner is None else torch_optimizers(inner)


def use_fused_adam(optimizer: Any) -> list[torch.optim.Optimizer]:
    """Switch every param group of the torch Adam/AdamW optimizers inside ``optimizer`` to
    ``fused=True, foreach=False``; returns them. Before the first step only: Adam reads both flags
    per group at every step, but creates ``state["step"]`` once, on the CPU unless fused or capturable
    (fused wants it as a fp32 tensor on the parameter's device). Refuses other optimizers and
    ``differentiable`` groups, which fused Adam does not do, rather than leaving them unfused quietly."""
    inner = torch_optimizers(optimizer)
    for opt in inner:
        if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):  # separate classes in older torch
            raise TypeError(f"use_fused_adam: {type(opt).__name__} is not torch's Adam/AdamW")
        if any(len(state) for state in opt.state.values()):
            raise RuntimeError("use_fused_adam: the optimizer has state already (call it before step)")
        if any(group.get("differentiable") for group in opt.param_groups):
            raise NotImplementedError("use_fused_adam: fused Adam does not support differentiable=True")
    for opt in inner:
        for group in [*opt.param_groups, opt.defaults]:
            group["fused"], group["foreach"] = True, False
        # what Adam.__init__(fused=True) sets (GradScaler reads it)
        opt._step_supports_amp_scaling = True  # type: ignore[attr-defined]  # private: not in torch's stubs
    return inner
