"""The pure parts of disaggregated sync (sync/nccl.py): bucket plans, the packed byte layout (cast to
the engines' dtype on the way) and the request checks, plus the group itself between two CPU
processes over gloo. The transport's driving: test_sync_transports.py."""

from __future__ import annotations

import multiprocessing as mp
import socket
from typing import Any

import pytest
import torch

from rljob_runtime.sync.nccl import (
    BucketSpec,
    NcclSender,
    WeightUpdateGroup,
    bucket_specs,
    pack,
    receive,
    spec_from_body,
    unpack,
)


def _named() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "emb": torch.randn(7, 3, generator=gen).to(torch.bfloat16),
        "norm": torch.randn(3, generator=gen),
        "w": torch.randn(5, 4, generator=gen).to(torch.bfloat16),
        "step": torch.tensor([3], dtype=torch.int64),
    }


def test_buckets_pack_and_unpack_bit_exactly() -> None:
    named = _named()
    specs = bucket_specs(named.items(), max_bytes=48)
    assert [s.names for s in specs] == [("emb",), ("w",), ("norm",), ("step",)]  # one dtype per bucket
    for spec in specs:
        flat = pack([named[n] for n in spec.names])
        assert flat.dtype == torch.uint8 and flat.numel() == spec.nbytes
        for name, view in unpack(flat, spec):
            assert view.dtype == named[name].dtype and torch.equal(view, named[name])
    one = bucket_specs(named.items(), max_bytes=1 << 20)
    assert [s.names for s in one] == [("emb", "w"), ("norm",), ("step",)]  # order kept within a dtype


def test_pack_casts_to_the_planned_dtype() -> None:
    named = {"w": torch.randn(4, 3), "ids": torch.arange(3)}
    specs = bucket_specs(named.items(), max_bytes=1 << 20, cast=torch.bfloat16)
    assert [(s.names, s.dtypes) for s in specs] == [(("w",), ("bfloat16",)), (("ids",), ("int64",))]
    flat = pack([named["w"]], [torch.bfloat16])
    ((_, view),) = unpack(flat, specs[0])
    assert view.dtype == torch.bfloat16 and torch.equal(view, named["w"].to(torch.bfloat16))


def test_unpack_refuses_a_bucket_of_the_wrong_size_or_alignment() -> None:
    spec = BucketSpec(("a",), ("float32",), ((4,),))
    with pytest.raises(ValueError, match="bucket of 12 bytes, its tensors need 16"):
        unpack(torch.zeros(12, dtype=torch.uint8), spec)
    odd = BucketSpec(("x", "y"), ("uint8", "float32"), ((1,), (1,)))
    with pytest.raises(ValueError, match="'y': byte offset 1 is not aligned for float32"):
        unpack(torch.zeros(5, dtype=torch.uint8), odd)


def test_request_bodies_are_checked_before_the_engine_waits_on_a_broadcast() -> None:
    body = BucketSpec(("a", "b"), ("bfloat16", "float32"), ((2, 3), (4,))).body("g", "7")
    assert body["load_format"] == "flattened_bucket" and body["weight_version"] == "7"
    assert spec_from_body(body) == BucketSpec(("a", "b"), ("bfloat16", "float32"), ((2, 3), (4,)))
    with pytest.raises(ValueError, match="unknown dtype 'bfloat17'"):
        spec_from_body({**body, "dtypes": ["bfloat17", "float32"]})
    with pytest.raises(ValueError, match="2, 1, 2 entries"):
        spec_from_body({**body, "dtypes": ["float32"]})
    with pytest.raises(ValueError, match="negative"):
        spec_from_body({**body, "shapes": [[2, -3], [4]]})
    with pytest.raises(ValueError, match="required lists"):
        spec_from_body({"names": "a"})


def _engine(port: int, specs: list[BucketSpec], out: Any) -> None:
    group = WeightUpdateGroup("127.0.0.1", port, 1, 2, "g", backend="gloo", timeout_s=60)
    got = {}
    for spec in specs:
        got.update({n: t.clone() for n, t in receive(group, spec)})
    out.put(
        {n: t.view(torch.uint8).tolist() if t.dtype == torch.bfloat16 else t.tolist() for n, t in got.items()}
    )
    group.close()


def test_a_two_process_group_moves_every_bucket_in_order() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    named = _named()
    specs = bucket_specs(named.items(), max_bytes=48)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    engine = ctx.Process(target=_engine, args=(port, specs, out))
    engine.start()
    try:
        group = WeightUpdateGroup("127.0.0.1", port, 0, 2, "g", backend="gloo", timeout_s=60)
        assert NcclSender(group).send(named, specs) == sum(s.nbytes for s in specs)
        got = out.get(timeout=60)
    finally:
        engine.join(timeout=30)
    want = {
        n: t.view(torch.uint8).tolist() if t.dtype == torch.bfloat16 else t.tolist() for n, t in named.items()
    }
    assert got == want
    with pytest.raises(ValueError, match="rank 0"):
        NcclSender(type("G", (), {"rank": 1})())  # type: ignore[arg-type]
