"""The pure parts of disaggregated sync (sync/nccl.py) and its driving (WeightSync, the manager's
request order), plus the group itself between two CPU processes over gloo."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
from typing import Any

import pytest
import torch
from test_rollout_manager_weights import bare_manager, record_requests
from test_weight_sync_ipc import _spec

from rljob_runtime.rollout.manager import RolloutManager
from rljob_runtime.rollout.weight_updates import WeightUpdate
from rljob_runtime.sync import WeightSync
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


# ------------------------------------------------------------------------------ WeightSync driving


class FakeTrainer:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def weight_group_address(self) -> tuple[str, int]:
        return "10.0.0.1", 1234

    def init_weight_update_group(self, address: str, port: int, world: int, name: str, backend: str) -> str:
        self.calls.append(("init", world, name, backend))
        return "init-ref"

    def close_weight_update_group(self) -> None:
        self.calls.append(("close",))

    def weight_bucket_specs(self, max_bytes: int) -> list[BucketSpec]:
        self.calls.append(("specs", max_bytes))
        return [BucketSpec(("a",), ("float32",), ((4,),)), BucketSpec(("b",), ("bfloat16",), ((2,),))]

    def broadcast_weights(self, specs: list[BucketSpec]) -> list[str]:
        self.calls.append(("send", [s.names for s in specs]))
        return ["send-ref"]

    def wait(self, refs: list[str]) -> list[Any]:
        self.calls.append(("wait", refs))
        return [{"bytes": 20}] if refs == ["send-ref"] else [None]


class FakeRollout:
    def __init__(self) -> None:
        self.membership_epoch = 0
        self.calls: list[Any] = []
        self.fail = False

    def weight_group_world_size(self) -> int:
        return 3

    def join_weights_update_group(self, address: str, port: int, world: int, name: str, backend: str) -> int:
        self.calls.append(("join", address, port, world, name))
        return self.membership_epoch

    def leave_weights_update_group(self, name: str) -> None:
        self.calls.append(("leave", name))

    def update_weights_from_distributed(self, bodies: list[dict[str, Any]], version: int) -> str:
        self.calls.append(
            ("update", [b["names"] for b in bodies], [b["group_name"] for b in bodies], version)
        )
        if self.fail:
            raise RuntimeError("engine refused")
        return str(version)


def test_the_group_is_built_once_rebuilt_after_a_relaunch_and_after_a_failure() -> None:
    sync = WeightSync(_spec(colocate=False), single_node=True, bucket_bytes=99)
    assert sync.transport == "nccl"
    trainer, rollout = FakeTrainer(), FakeRollout()
    first = sync.push(trainer, rollout, version=1)
    assert trainer.calls == [
        ("init", 3, "rljob-weights-1", "nccl"),
        ("wait", ["init-ref"]),
        ("specs", 99),
        ("send", [("a",), ("b",)]),
        ("wait", ["send-ref"]),
    ]
    assert rollout.calls == [
        ("join", "10.0.0.1", 1234, 3, "rljob-weights-1"),
        ("update", [["a"], ["b"]], ["rljob-weights-1"] * 2, 1),
    ]
    assert first["sync/bytes"] == 20 and first["sync/buckets"] == 2 and first["time/sync_group_init"] > 0
    trainer.calls.clear()
    rollout.calls.clear()
    assert sync.push(trainer, rollout, version=2)["time/sync_group_init"] == 0.0
    assert [c[0] for c in trainer.calls] == ["send", "wait"]  # same group, specs cached

    rollout.membership_epoch = 1  # an engine was relaunched
    rollout.calls.clear()
    sync.push(trainer, rollout, version=3)
    assert rollout.calls[:2] == [
        ("leave", "rljob-weights-1"),
        ("join", "10.0.0.1", 1234, 3, "rljob-weights-2"),
    ]

    rollout.fail = True
    with pytest.raises(RuntimeError, match="engine refused"):
        sync.push(trainer, rollout, version=4)
    rollout.fail = False
    rollout.calls.clear()
    sync.push(trainer, rollout, version=5)
    assert rollout.calls[:2] == [
        ("leave", "rljob-weights-2"),
        ("join", "10.0.0.1", 1234, 3, "rljob-weights-3"),
    ]


def test_manager_sends_one_distributed_request_per_bucket_then_continues() -> None:
    manager, _ = bare_manager()
    posted = record_requests(manager)
    bodies = tuple(BucketSpec((n,), ("float32",), ((2,),)).body("g") for n in ("a", "b"))
    update = WeightUpdate("distributed", "9", buckets=bodies)
    asyncio.run(RolloutManager._update_engine(manager, "http://e", update))
    assert [p for p, _ in posted] == [
        "/pause_generation",
        "/flush_cache",
        "/update_weights_from_distributed",
        "/update_weights_from_distributed",
        "/continue_generation",
    ]
    first, last = posted[2][1], posted[3][1]
    assert first["names"] == ["a"] and "weight_version" not in first
    assert last["names"] == ["b"] and last["weight_version"] == "9"
