"""Flattened buckets and the CUDA IPC weight-sync wiring, on CPU (the GPU path itself:
tests/gpu/test_cuda_ipc_sync.py)."""

from __future__ import annotations

import asyncio
import base64
import os
import pickle
from typing import Any

import pytest
import torch
from test_rollout_manager_weights import _update, bare_manager, record_requests

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.rollout import protocol
from rljob_runtime.rollout.weight_updates import WeightUpdate
from rljob_runtime.sync import WeightSync, check_supported, choose_transport
from rljob_runtime.sync.buckets import flatten_bucket, flatten_buckets, plan_buckets, unflatten_bucket
from rljob_runtime.sync.cuda_ipc import IpcProducer, decode_bucket, encode_bucket, is_ipc_payload


def mixed_tensors() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        ("embed", torch.randn(50, 8, generator=gen).to(torch.bfloat16)),
        ("norm", torch.randn(8, generator=gen)),
        ("q", torch.randn(8, 8, generator=gen).to(torch.bfloat16)),
        ("scalar", torch.tensor(3.5)),
        ("ids", torch.arange(7, dtype=torch.int64).view(7, 1)),
        ("k", torch.randn(4, 8, generator=gen).to(torch.bfloat16)),
    ]


# ---------------------------------------------------------------------------------------- buckets


@pytest.mark.parametrize("max_bytes", [1, 64, 256, 1 << 20])
def test_round_trip_is_bit_exact_for_mixed_dtypes(max_bytes: int) -> None:
    named = mixed_tensors()
    buckets = flatten_buckets(named, max_bytes)
    back = dict(kv for b in buckets for kv in unflatten_bucket(b.flat, b.metadata))
    assert set(back) == {n for n, _ in named}
    for name, tensor in named:
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        # bit patterns, not values: bit-exact
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_buckets_hold_one_dtype_and_respect_the_limit() -> None:
    named = mixed_tensors()
    limit = 200
    plans = plan_buckets(named, limit)
    for items in plans:
        assert len({t.dtype for _, t in items}) == 1
        size = sum(t.numel() * t.element_size() for _, t in items)
        assert size <= limit or len(items) == 1  # only a tensor larger than the limit stands alone
    # embed (800 B bf16) is over the limit: a bucket of its own
    assert [n for n, _ in plans[0]] == ["embed"]
    # order within a dtype is kept
    bf16 = [n for items in plans for n, t in items if t.dtype == torch.bfloat16]
    assert bf16 == ["embed", "q", "k"]


def test_one_bucket_per_dtype_when_the_limit_is_large() -> None:
    buckets = flatten_buckets(mixed_tensors(), 1 << 30)
    assert [b.flat.dtype for b in buckets] == [torch.bfloat16, torch.float32, torch.int64]
    meta = buckets[0].metadata
    assert [m["name"] for m in meta] == ["embed", "q", "k"]
    assert meta[1] == {
        "name": "q",
        "shape": [8, 8],
        "dtype": "bfloat16",
        "start_idx": 400,
        "end_idx": 464,
        "numel": 64,
    }
    assert buckets[0].nbytes == (400 + 64 + 32) * 2


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        flatten_bucket([("a", torch.zeros(2)), ("b", torch.zeros(2, dtype=torch.int32))])
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([], 0)
    flat = torch.arange(4.0)
    with pytest.raises(ValueError, match="outside"):
        unflatten_bucket(flat, [{"name": "x", "shape": [5], "start_idx": 0, "end_idx": 5, "numel": 5}])
    with pytest.raises(ValueError, match="dtype"):
        unflatten_bucket(
            flat, [{"name": "x", "shape": [4], "dtype": "bfloat16", "start_idx": 0, "end_idx": 4, "numel": 4}]
        )


def test_unflatten_gives_views_not_copies() -> None:
    bucket = flatten_bucket([("a", torch.ones(2, 2)), ("b", torch.ones(3))])
    (_, a), (_, b) = unflatten_bucket(bucket.flat, bucket.metadata)
    bucket.flat.fill_(7.0)
    assert a.sum() == 28 and b.sum() == 21


# ------------------------------------------------------------------------------------ IPC payload


def test_cpu_format_still_reads_and_ipc_payloads_are_told_apart() -> None:
    data = protocol.serialize_named_tensors([("w", torch.ones(3))], flattened_bucket=True)
    raw = base64.b64decode(data)
    assert not is_ipc_payload(raw)
    assert torch.equal(protocol.deserialize_named_tensors(data, "flattened_bucket")[0][1], torch.ones(3))
    assert is_ipc_payload(pickle.dumps({"flattened_tensor": None}))


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_the_ipc_unpickler_refuses_arbitrary_globals() -> None:
    data = base64.b64encode(pickle.dumps({"flattened_tensor": _Evil(), "metadata": []})).decode()
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        protocol.deserialize_named_tensors(data, "flattened_bucket")


def test_the_ipc_unpickler_accepts_torch_types_but_wants_a_tensor() -> None:
    raw = pickle.dumps(
        {"flattened_tensor": (torch.Size([2]), torch.bfloat16, torch.device("cpu")), "metadata": []}
    )
    with pytest.raises(ValueError, match="flattened_tensor"):
        decode_bucket(raw)


def test_cpu_tensors_cannot_be_shared_by_ipc() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        encode_bucket(flatten_bucket([("w", torch.ones(2))]))
    with pytest.raises(ValueError, match="CUDA"):
        IpcProducer().share([("w", torch.ones(2))])


# ------------------------------------------------------------------------------------ transports


def _spec(device: str = "cuda", colocate: bool = True, backend: str = "torch") -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/unused", "dtype": "bfloat16"},
            "data": {"path": "/unused.jsonl"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4},
            "training": {"backend": backend, "globalBatchSize": 8, "microBatchSize": 1},
            "resources": {
                "device": device,
                "colocate": colocate,
                "trainer": {"nodes": 1, "gpusPerNode": 1},
                **({} if colocate else {"rollout": {"gpus": 1}}),
            },
        }
    )


def test_transport_choice() -> None:
    assert choose_transport(_spec(), single_node=True) == "cuda_ipc"
    assert choose_transport(_spec(colocate=False), single_node=True) == "nccl"
    assert choose_transport(_spec(colocate=False), single_node=False) == "nccl"
    assert choose_transport(_spec(device="cpu"), single_node=True) == "disk"
    assert choose_transport(_spec(device="cpu"), single_node=False) == "tensors"
    check_supported(_spec(), single_node=True)
    check_supported(_spec(colocate=False), single_node=False)  # engines on their own GPUs: NCCL
    with pytest.raises(NotImplementedError, match="colocate true across nodes"):
        check_supported(_spec(), single_node=False)


class FakeTrainer:
    supports_cuda_ipc = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def share_weights_ipc(self, max_bucket_bytes: int) -> tuple[list[str], int]:
        self.calls.append(f"share {max_bucket_bytes}")
        return ["b0", "b1"], 4096

    def release_weights_ipc(self) -> None:
        self.calls.append("release")

    def named_tensors(self) -> dict[str, torch.Tensor]:
        self.calls.append("named")
        return {"w": torch.ones(2)}


class FakeRollout:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.got: list[Any] = []

    def update_weights_from_ipc(self, payloads: list[str], version: int) -> str:
        self.got.append(("ipc", payloads, version))
        if self.fail:
            raise RuntimeError("engine down")
        return str(version)

    def update_weights_from_disk(self, path: Any, version: int) -> str:
        self.got.append(("disk", version))
        return str(version)


def test_ipc_push_releases_the_buckets_only_after_the_engines_answer() -> None:
    sync = WeightSync(_spec(), single_node=True, bucket_bytes=7, ipc_bucket_bytes=123)
    trainer, rollout = FakeTrainer(), FakeRollout()
    metrics = sync.push(trainer, rollout, version=5)
    assert rollout.got == [("ipc", ["b0", "b1"], 5)]
    assert trainer.calls == ["share 123", "release"]
    assert metrics["sync/buckets"] == 2.0 and metrics["sync/bytes"] == 4096.0 and metrics["time/sync"] >= 0
    failing = FakeRollout(fail=True)
    trainer.calls.clear()
    with pytest.raises(RuntimeError):
        sync.push(trainer, failing, version=6)
    assert trainer.calls == ["share 123", "release"]
    sync.close()


def test_a_backend_without_ipc_export_falls_back_to_the_shm_file() -> None:
    sync = WeightSync(_spec(), single_node=True)
    trainer, rollout = FakeTrainer(), FakeRollout()
    trainer.supports_cuda_ipc = False
    sync.push(trainer, rollout, version=2)
    assert rollout.got == [("disk", 2)] and trainer.calls == ["named"]
    sync.close()


def test_manager_sends_one_request_per_bucket_and_the_version_with_the_last() -> None:
    manager, _ = bare_manager()
    posted = record_requests(manager)
    update = WeightUpdate("ipc", "7", serialized=("b0", "b1"), load_format="flattened_bucket")
    from rljob_runtime.rollout.manager import RolloutManager

    asyncio.run(RolloutManager._update_engine(manager, "http://e", update))
    paths = [p for p, _ in posted]
    assert paths == [
        "/pause_generation",
        "/flush_cache",
        "/update_weights_from_tensor",
        "/update_weights_from_tensor",
        "/continue_generation",
    ]
    first, last = posted[2][1], posted[3][1]
    assert first["serialized_named_tensors"] == ["b0"] and "weight_version" not in first
    assert last["serialized_named_tensors"] == ["b1"] and last["weight_version"] == "7"
    assert first["load_format"] == "flattened_bucket" and first["flush_cache"] is False


def test_manager_keeps_no_ipc_handles_for_relaunched_engines() -> None:
    manager, _ = bare_manager(provider=lambda: [("w", torch.ones(1))])
    asyncio.run(
        _update(manager, WeightUpdate("ipc", "3", serialized=("b0",), load_format="flattened_bucket"))
    )
    assert manager.weight_version == "3"
    assert manager._last_update == WeightUpdate("tensors", "3")


def test_the_servers_loader_reads_a_bucket_into_the_engine() -> None:
    import threading

    from rljob_runtime.rollout.hf_engine import HFEngine
    from rljob_runtime.rollout.hf_weights import load_serialized_tensors

    params = {"a": torch.zeros(2, 2), "b": torch.zeros(3, dtype=torch.bfloat16)}
    engine = HFEngine.__new__(HFEngine)  # the weight loader alone: no model directory
    engine.lock = threading.Lock()
    engine.named_weights = lambda: params  # type: ignore[method-assign]
    data = protocol.serialize_named_tensors([("a", torch.ones(2, 2))], flattened_bucket=True)
    timings: dict[str, float] = {}
    assert load_serialized_tensors(engine, data, "flattened_bucket", timings) == 1
    assert torch.equal(params["a"], torch.ones(2, 2)) and not params["b"].any()
    assert list(timings) == ["decode_ms", "copy_ms", "sync_ms", "release_ms"]
    assert all(ms >= 0 for ms in timings.values())


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64, expandable_segments:true"}, True),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
        (
            {
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                "PYTORCH_ALLOC_CONF": "expandable_segments:False",
            },
            False,
        ),
    ],
)
def test_expandable_segments_read_from_the_allocator_config(environ: dict[str, str], expected: bool) -> None:
    from rljob_runtime.sync.cuda_ipc import expandable_segments_requested

    assert expandable_segments_requested(environ) is expected


def test_buckets_are_allocated_with_expandable_segments_off_then_back_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from rljob_runtime.sync import cuda_ipc

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    on = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(RuntimeError), cuda_ipc.plain_segments(on):
        assert calls == ["expandable_segments:False"]
        raise RuntimeError("a failed flatten still restores the setting")
    assert calls == ["expandable_segments:False", "expandable_segments:True"]
    calls.clear()
    with cuda_ipc.plain_segments({}):  # not asked for: nothing is switched
        pass
    assert calls == []
