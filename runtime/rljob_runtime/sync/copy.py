"""Many tensor copies at once: the step every weight sync repeats for each of a model's ~400 tensors
(flattening into buckets on the trainer, loading into the parameters on the engine)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def copy_all(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``dst.copy_(src)`` for every ``(dst, src)`` pair (casting and moving devices as ``copy_`` does).

    Pairs whose source already has the destination's device and dtype go through one
    ``torch._foreach_copy_`` per (device, dtype): on a GPU a handful of multi-tensor kernels instead of
    one launch and some 10-40 us of Python per tensor, which for a 4B model's 400 tensors was most of
    an engine's load time (docs/BENCHMARKS.md, commit 9a76790). Strided sources are fine: foreach falls
    back to per-tensor ``copy_`` for pairs whose layouts differ."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    with torch.no_grad():
        for dst, src in pairs:
            if dst.shape != src.shape:
                raise ValueError(f"copy of shape {tuple(src.shape)} into {tuple(dst.shape)}")
            if src.device == dst.device and src.dtype == dst.dtype:
                dsts, srcs = groups.setdefault((dst.device, dst.dtype), ([], []))
                dsts.append(dst)
                srcs.append(src)
            else:
                dst.copy_(src)
        for dsts, srcs in groups.values():
            torch._foreach_copy_(dsts, srcs)
