"""Flattened weight buckets in SGLang's layout (``sglang.srt.weight_sync.tensor_bucket``).

A bucket is one 1-D ``uint8`` tensor holding its named tensors' bytes back to back, and per tensor
the metadata of SGLang's ``FlattenedTensorMetadata``: ``name``, ``shape``, ``dtype``, ``start_idx``,
``end_idx`` and ``numel``, the indices and ``numel`` counted in bytes of the flat tensor. SGLang
reads a tensor back as ``flat[start_idx:end_idx].view(dtype).reshape(shape)``; the NCCL receiver
allocates the same layout for ``/update_weights_from_distributed`` with ``load_format:
"flattened_bucket"``. Here the metadata is plain dicts (``dtype`` a string); the wire codecs
(``cuda_ipc.py``) turn them into what the engine unpickles.

A bucket holds one dtype, so every tensor starts at a byte offset aligned for its dtype (SGLang's
``view(dtype)`` needs that), and at most ``max_bytes`` unless one tensor is larger. Few large buckets
instead of a message per tensor: one IPC handle or broadcast per bucket instead of hundreds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .copy import copy_all

DEFAULT_BUCKET_BYTES = 1 << 30  # 1 GiB: IPC copies reach ~0.65-1 TB/s from here (performance.md)
METADATA_KEYS = ("name", "shape", "dtype", "start_idx", "end_idx", "numel")


@dataclass
class Bucket:
    """One flattened bucket: ``flat`` (1-D uint8) and where each named tensor lies in it (bytes)."""

    flat: torch.Tensor
    metadata: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.flat.numel()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def target_dtype(tensor: torch.Tensor, cast: torch.dtype | None = None) -> torch.dtype:
    """The dtype a tensor travels as: floating tensors as ``cast`` when given (a trainer keeping fp32
    master weights sends what a bf16 engine loads: half the bytes), the rest as they are."""
    return cast if cast is not None and tensor.is_floating_point() else tensor.dtype


def _bytes(tensor: torch.Tensor, cast: torch.dtype | None) -> int:
    return tensor.numel() * target_dtype(tensor, cast).itemsize


def plan_buckets(
    named: Iterable[tuple[str, torch.Tensor]],
    max_bytes: int = DEFAULT_BUCKET_BYTES,
    cast: torch.dtype | None = None,
) -> list[list[tuple[str, torch.Tensor]]]:
    """Group tensors into buckets of one (travelling) dtype and at most ``max_bytes`` (a larger tensor
    gets a bucket of its own). Order within a dtype is kept; dtypes come in order of first appearance."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    open_buckets: dict[torch.dtype, tuple[list[tuple[str, torch.Tensor]], int]] = {}
    done: list[list[tuple[str, torch.Tensor]]] = []
    order: list[torch.dtype] = []
    for name, tensor in named:
        dtype, size = target_dtype(tensor, cast), _bytes(tensor, cast)
        items, used = open_buckets.get(dtype, ([], 0))
        if dtype not in order:
            order.append(dtype)
        if items and used + size > max_bytes:
            done.append(items)
            items, used = [], 0
        items.append((name, tensor))
        open_buckets[dtype] = (items, used + size)
    done.extend(open_buckets[d][0] for d in order if open_buckets[d][0])
    return done


def metadata_of(
    items: list[tuple[str, torch.Tensor]], cast: torch.dtype | None = None
) -> list[dict[str, Any]]:
    """SGLang's per-tensor metadata of one bucket, byte offsets in plan order."""
    metadata, start = [], 0
    for name, tensor in items:
        size = _bytes(tensor, cast)
        metadata.append(
            {
                "name": name,
                "shape": list(tensor.shape),
                "dtype": dtype_name(target_dtype(tensor, cast)),
                "start_idx": start,
                "end_idx": start + size,
                "numel": size,
            }
        )
        start += size
    return metadata


def flatten_bucket(items: list[tuple[str, torch.Tensor]], cast: torch.dtype | None = None) -> Bucket:
    """Copy the tensors (one travelling dtype, one device) into one new uint8 tensor."""
    if not items:
        raise ValueError("empty bucket")
    dtypes = {target_dtype(t, cast) for _, t in items}
    if len(dtypes) != 1:
        raise ValueError(f"a bucket holds one dtype, got {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    metadata = metadata_of(items, cast)
    flat = torch.empty(metadata[-1]["end_idx"], dtype=torch.uint8, device=items[0][1].device)
    # one allocation, then each tensor copied (and cast) straight into its slice; strided sources too,
    # such as the q/k/v views of a fused qkv (reshape(-1) would first make a contiguous temporary)
    copy_all(
        [
            (flat[meta["start_idx"] : meta["end_idx"]].view(dtype).view(tensor.shape), tensor.detach())
            for meta, (_, tensor) in zip(metadata, items, strict=True)
        ]
    )
    return Bucket(flat, metadata)


def flatten_buckets(
    named: Iterable[tuple[str, torch.Tensor]],
    max_bytes: int = DEFAULT_BUCKET_BYTES,
    cast: torch.dtype | None = None,
) -> list[Bucket]:
    return [flatten_bucket(items, cast) for items in plan_buckets(named, max_bytes, cast)]


def _field(meta: Any, key: str) -> Any:
    """Metadata as our dicts or as objects with attributes (SGLang's ``FlattenedTensorMetadata``)."""
    return meta[key] if isinstance(meta, dict) else getattr(meta, key)


def unflatten_bucket(flat: torch.Tensor, metadata: list[Any]) -> list[tuple[str, torch.Tensor]]:
    """Views into the uint8 ``flat`` (no copy) under their names, dtypes and shapes; checks that the
    metadata fits the bucket and that every offset is aligned for its dtype."""
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"a flattened bucket is a 1-D uint8 tensor, got {flat.dtype} {tuple(flat.shape)}")
    out = []
    for meta in metadata:
        name = str(_field(meta, "name"))
        start, end = int(_field(meta, "start_idx")), int(_field(meta, "end_idx"))
        dtype = torch_dtype(dtype_name(d) if isinstance(d := _field(meta, "dtype"), torch.dtype) else d)
        shape = [int(s) for s in _field(meta, "shape")]
        if not 0 <= start <= end <= flat.numel() or end - start != int(_field(meta, "numel")):
            raise ValueError(f"{name!r}: bytes {start}:{end} outside a bucket of {flat.numel()}")
        if start % dtype.itemsize:
            raise ValueError(f"{name!r}: byte offset {start} is not aligned for {dtype}")
        view = flat[start:end].view(dtype)
        if view.numel() != _numel(shape):
            raise ValueError(f"{name!r}: {end - start} bytes do not hold shape {shape} of {dtype}")
        out.append((name, view.view(shape)))
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
