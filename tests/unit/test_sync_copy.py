"""copy_all: the batched copies behind bucket flattening, NCCL packing and the hf engine's loads."""

from __future__ import annotations

import pytest
import torch

from rljob_runtime.sync.buckets import flatten_bucket, unflatten_bucket
from rljob_runtime.sync.copy import copy_all
from rljob_runtime.sync.nccl import BucketSpec, pack, unpack


def test_copies_same_dtype_casts_and_strided_sources() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(3, 6, 4)  # [groups, (q + k + v) rows, hidden]: q of each group is strided
    q = qkv[:, :4]
    wide = torch.randn(5, 7, dtype=torch.float64)
    pairs = [
        (torch.empty(3, 4, 4), q),
        (torch.empty(7, 5), wide.t()),  # a transpose, and a cast from float64
        (torch.empty(2, dtype=torch.bfloat16), torch.tensor([1.5, -2.0], dtype=torch.bfloat16)),
    ]
    copy_all(pairs)
    assert torch.equal(pairs[0][0], q)
    assert torch.equal(pairs[1][0], wide.t().float())
    assert pairs[2][0].tolist() == [1.5, -2.0]


def test_refuses_a_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"copy of shape \(3,\) into \(4,\)"):
        copy_all([(torch.empty(4), torch.zeros(3))])


def test_flatten_and_pack_take_strided_tensors_without_changing_the_bytes() -> None:
    torch.manual_seed(1)
    fused = torch.randn(2, 5, 3)
    items = [("q", fused[:, :3]), ("k", fused[:, 3:]), ("t", torch.randn(3, 4).t())]
    bucket = flatten_bucket(items)
    for (name, view), (_, original) in zip(
        unflatten_bucket(bucket.flat, bucket.metadata), items, strict=True
    ):
        assert torch.equal(view, original), name
    spec = BucketSpec(
        tuple(n for n, _ in items), tuple("float32" for _ in items), tuple(tuple(t.shape) for _, t in items)
    )
    for (name, view), (_, original) in zip(unpack(pack([t for _, t in items]), spec), items, strict=True):
        assert torch.equal(view, original), name
