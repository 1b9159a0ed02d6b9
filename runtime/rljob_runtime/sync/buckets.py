"""Flattened weight buckets: named tensors packed into one 1-D tensor per dtype, at most N bytes each.

The metadata per tensor is SGLang's ``FlattenedTensorMetadata`` layout as plain dicts (``name``,
``shape``, ``dtype``, ``start_idx``, ``end_idx``, ``numel``; indices in elements of the bucket), the
same layout as ``load_format: "flattened_bucket"`` in ``rollout/protocol.py``. Few large buckets
instead of one message per tensor: one IPC handle (or one copy) per bucket instead of hundreds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .copy import copy_all

DEFAULT_BUCKET_BYTES = 1 << 30  # 1 GiB: IPC copies reach ~0.65-1 TB/s from here (performance.md)


@dataclass
class Bucket:
    """One flattened bucket: ``flat`` (1-D, one dtype) and where each named tensor lies in it."""

    flat: torch.Tensor
    metadata: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(
    named: Iterable[tuple[str, torch.Tensor]], max_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[list[tuple[str, torch.Tensor]]]:
    """Group tensors into buckets of one dtype and at most ``max_bytes`` (a larger tensor gets a
    bucket of its own). Order within a dtype is kept; dtypes come in order of first appearance."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    open_buckets: dict[torch.dtype, tuple[list[tuple[str, torch.Tensor]], int]] = {}
    done: list[list[tuple[str, torch.Tensor]]] = []
    order: list[torch.dtype] = []
    for name, tensor in named:
        size = tensor.numel() * tensor.element_size()
        items, used = open_buckets.get(tensor.dtype, ([], 0))
        if tensor.dtype not in order:
            order.append(tensor.dtype)
        if items and used + size > max_bytes:
            done.append(items)
            items, used = [], 0
        items.append((name, tensor))
        open_buckets[tensor.dtype] = (items, used + size)
    done.extend(open_buckets[d][0] for d in order if open_buckets[d][0])
    return done


def flatten_bucket(items: list[tuple[str, torch.Tensor]]) -> Bucket:
    """Copy the tensors (one dtype, one device) into one new 1-D tensor."""
    if not items:
        raise ValueError("empty bucket")
    dtypes = {t.dtype for _, t in items}
    if len(dtypes) != 1:
        raise ValueError(f"a bucket holds one dtype, got {sorted(map(str, dtypes))}")
    metadata, start = [], 0
    for name, tensor in items:
        numel = tensor.numel()
        metadata.append(
            {
                "name": name,
                "shape": list(tensor.shape),
                "dtype": _dtype_name(tensor.dtype),
                "start_idx": start,
                "end_idx": start + numel,
                "numel": numel,
            }
        )
        start += numel
    # one allocation, then each tensor copied straight into its slice (strided sources too, such as
    # the q/k/v views of a fused qkv: reshape(-1) would first make a contiguous temporary of them)
    flat = torch.empty(start, dtype=items[0][1].dtype, device=items[0][1].device)
    copy_all(
        [
            (flat[meta["start_idx"] : meta["end_idx"]].view(tensor.shape), tensor.detach())
            for meta, (_, tensor) in zip(metadata, items, strict=True)
        ]
    )
    return Bucket(flat, metadata)


def flatten_buckets(
    named: Iterable[tuple[str, torch.Tensor]], max_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[Bucket]:
    return [flatten_bucket(items) for items in plan_buckets(named, max_bytes)]


def unflatten_bucket(flat: torch.Tensor, metadata: list[dict[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    """Views into ``flat`` (no copy) under their names and shapes; checks the metadata fits."""
    out = []
    for meta in metadata:
        start, end = int(meta["start_idx"]), int(meta["end_idx"])
        shape = [int(s) for s in meta["shape"]]
        if not 0 <= start <= end <= flat.numel() or end - start != int(meta["numel"]):
            raise ValueError(f"{meta.get('name')!r}: range {start}:{end} outside a bucket of {flat.numel()}")
        if meta.get("dtype") not in (None, _dtype_name(flat.dtype)):
            raise ValueError(f"{meta['name']!r}: dtype {meta['dtype']} in a {flat.dtype} bucket")
        out.append((str(meta["name"]), flat[start:end].view(shape)))
    return out
