"""Flattened buckets in SGLang's layout, checked against SGLang's own ``FlattenedTensorBucket`` (its
module loaded alone from the installed wheel: it needs only torch), and the CUDA IPC wire pieces
that run without a GPU (the GPU path itself: tests/gpu/test_sglang_engines.py)."""

from __future__ import annotations

import base64
import importlib.util
import os
import pickle
import sys
import threading
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from rljob_runtime import engine_api
from rljob_runtime.rollout.hf_weights import decode_named_tensors
from rljob_runtime.sync.buckets import (
    METADATA_KEYS,
    flatten_bucket,
    flatten_buckets,
    plan_buckets,
    unflatten_bucket,
)
from rljob_runtime.sync.cuda_ipc import decode_bucket, encode_bucket, is_ipc_payload
from rljob_runtime.sync.nccl import bucket_specs, pack


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


def bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()


@cache
def sglang_tensor_bucket() -> ModuleType:
    """``sglang/srt/weight_sync/tensor_bucket.py`` of the installed (pinned) SGLang, imported alone."""
    found = importlib.util.find_spec("sglang")
    if found is None or not found.submodule_search_locations:
        pytest.fail("the sglang wheel's source is needed (make venv installs it without dependencies)")
    path = Path(next(iter(found.submodule_search_locations))) / "srt" / "weight_sync" / "tensor_bucket.py"
    spec = importlib.util.spec_from_file_location("sglang_tensor_bucket_alone", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------- our layout


@pytest.mark.parametrize("max_bytes", [1, 64, 256, 1 << 20])
def test_round_trip_is_bit_exact_for_mixed_dtypes(max_bytes: int) -> None:
    named = mixed_tensors()
    buckets = flatten_buckets(named, max_bytes)
    assert all(b.flat.dtype == torch.uint8 for b in buckets)
    back = dict(kv for b in buckets for kv in unflatten_bucket(b.flat, b.metadata))
    assert set(back) == {n for n, _ in named}
    for name, tensor in named:
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        assert bits(back[name]) == bits(tensor)


def test_buckets_hold_one_dtype_and_respect_the_limit() -> None:
    plans = plan_buckets(mixed_tensors(), 200)
    for items in plans:
        assert len({t.dtype for _, t in items}) == 1
        assert sum(t.numel() * t.element_size() for _, t in items) <= 200 or len(items) == 1
    assert [n for n, _ in plans[0]] == ["embed"]  # 800 bytes: over the limit, a bucket of its own
    assert [n for items in plans for n, t in items if t.dtype == torch.bfloat16] == ["embed", "q", "k"]


def test_metadata_counts_bytes_as_sglang_does() -> None:
    bucket = flatten_buckets(mixed_tensors(), 1 << 30)[0]
    assert [m["name"] for m in bucket.metadata] == ["embed", "q", "k"]
    assert bucket.metadata[1] == {
        "name": "q",
        "shape": [8, 8],
        "dtype": "bfloat16",
        "start_idx": 800,
        "end_idx": 928,
        "numel": 128,
    }
    assert bucket.nbytes == (400 + 64 + 32) * 2 and set(bucket.metadata[0]) == set(METADATA_KEYS)


def test_floating_tensors_travel_in_the_engines_dtype() -> None:
    named = [("w", torch.randn(3, 2)), ("ids", torch.arange(4)), ("b", torch.randn(2))]
    plans = plan_buckets(named, 1 << 20, cast=torch.bfloat16)
    assert [[n for n, _ in items] for items in plans] == [["w", "b"], ["ids"]]
    bucket = flatten_bucket(plans[0], cast=torch.bfloat16)
    assert bucket.nbytes == (6 + 2) * 2
    (_, w), (_, b) = unflatten_bucket(bucket.flat, bucket.metadata)
    assert w.dtype == torch.bfloat16 and torch.equal(w, named[0][1].to(torch.bfloat16))
    assert torch.equal(b, named[2][1].to(torch.bfloat16))


def test_strided_sources_are_copied_without_a_contiguous_temporary_and_exactly() -> None:
    fused = torch.randn(6, 4)
    q, k = fused[:3], fused[3:].t()  # k: a transposed view
    bucket = flatten_bucket([("q", q), ("k", k)])
    (_, q2), (_, k2) = unflatten_bucket(bucket.flat, bucket.metadata)
    assert torch.equal(q2, q) and torch.equal(k2, k)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        flatten_bucket([("a", torch.zeros(2)), ("b", torch.zeros(2, dtype=torch.int32))])
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([], 0)
    flat = torch.zeros(16, dtype=torch.uint8)
    meta = {"name": "x", "shape": [5], "dtype": "float32", "start_idx": 0, "end_idx": 20, "numel": 20}
    with pytest.raises(ValueError, match="outside"):
        unflatten_bucket(flat, [meta])
    with pytest.raises(ValueError, match="aligned"):
        unflatten_bucket(flat, [{**meta, "shape": [2], "start_idx": 2, "end_idx": 10, "numel": 8}])
    with pytest.raises(ValueError, match="shape"):
        unflatten_bucket(flat, [{**meta, "shape": [3], "end_idx": 8, "numel": 8}])
    with pytest.raises(ValueError, match="uint8"):
        unflatten_bucket(torch.zeros(4), [])


def test_unflatten_gives_views_not_copies() -> None:
    bucket = flatten_bucket([("a", torch.ones(2, 2)), ("b", torch.ones(3))])
    (_, a), (_, b) = unflatten_bucket(bucket.flat, bucket.metadata)
    bucket.flat.view(torch.float32).fill_(7.0)
    assert a.sum() == 28 and b.sum() == 21


# ------------------------------------------------------------ the contract with SGLang's own class


def test_our_bucket_is_the_one_sglang_builds_and_reads() -> None:
    tb = sglang_tensor_bucket()
    fields = {f.name for f in tb.FlattenedTensorMetadata.__dataclass_fields__.values()}
    assert fields == set(METADATA_KEYS)
    for items in plan_buckets(mixed_tensors(), 1 << 20):
        ours = flatten_bucket(items)
        theirs = tb.FlattenedTensorBucket(named_tensors=items)
        assert torch.equal(ours.flat, theirs.get_flattened_tensor())  # same bytes, same dtype (uint8)
        for mine, meta in zip(ours.metadata, theirs.get_metadata(), strict=True):
            assert mine["name"] == meta.name and mine["shape"] == list(meta.shape)
            assert mine["dtype"] == str(meta.dtype).removeprefix("torch.")
            assert (mine["start_idx"], mine["end_idx"], mine["numel"]) == (
                meta.start_idx,
                meta.end_idx,
                meta.numel,
            )
        # SGLang reads our bucket back as it would its own (what the engine's weight updater does)
        rebuilt = tb.FlattenedTensorBucket(
            flattened_tensor=ours.flat,
            metadata=[
                tb.FlattenedTensorMetadata(
                    name=m["name"],
                    shape=torch.Size(m["shape"]),
                    dtype=getattr(torch, m["dtype"]),
                    start_idx=m["start_idx"],
                    end_idx=m["end_idx"],
                    numel=m["numel"],
                )
                for m in ours.metadata
            ],
        ).reconstruct_tensors()
        assert [(n, bits(t)) for n, t in rebuilt] == [(n, bits(t)) for n, t in items]


def test_the_nccl_bucket_is_what_sglangs_receiver_allocates() -> None:
    """SGLang's ``_update_bucketed_weights_from_distributed`` receives into
    ``FlattenedTensorBucket(named_tensors=[empty tensors of the listed names, dtypes, shapes])``: our
    sender's packed bytes must have that size and layout."""
    tb = sglang_tensor_bucket()
    named = dict(mixed_tensors())
    for spec in bucket_specs(named.items(), max_bytes=256):
        tensors = [named[n] for n in spec.names]
        theirs = tb.FlattenedTensorBucket(named_tensors=list(zip(spec.names, tensors, strict=True)))
        assert torch.equal(pack(tensors), theirs.get_flattened_tensor())


# ---------------------------------------------------------------------------------- IPC payloads


def test_cpu_format_still_reads_and_ipc_payloads_are_told_apart() -> None:
    data = engine_api.serialize_named_tensors([("w", torch.ones(3))], flattened_bucket=True)
    assert not is_ipc_payload(base64.b64decode(data))
    assert torch.equal(decode_named_tensors(data, "flattened_bucket")[0][1], torch.ones(3))
    assert is_ipc_payload(pickle.dumps({"flattened_tensor": None}))


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_the_ipc_unpickler_refuses_arbitrary_globals() -> None:
    data = base64.b64encode(pickle.dumps({"flattened_tensor": _Evil(), "metadata": []})).decode()
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        decode_named_tensors(data, "flattened_bucket")


def test_the_ipc_unpickler_accepts_torch_types_but_wants_a_tensor() -> None:
    raw = pickle.dumps(
        {"flattened_tensor": (torch.Size([2]), torch.bfloat16, torch.device("cpu")), "metadata": []}
    )
    with pytest.raises(ValueError, match="flattened_tensor"):
        decode_bucket(raw)


def test_cpu_buckets_cannot_be_shared_by_ipc() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        encode_bucket(flatten_bucket([("w", torch.ones(2))]))


def test_the_servers_loader_reads_a_bucket_into_the_engine() -> None:
    from rljob_runtime.rollout.hf_engine import HFEngine
    from rljob_runtime.rollout.hf_weights import load_serialized_tensors

    params = {"a": torch.zeros(2, 2), "b": torch.zeros(3, dtype=torch.bfloat16)}
    engine = HFEngine.__new__(HFEngine)  # the weight loader alone: no model directory
    engine.lock = threading.Lock()
    engine.named_weights = lambda: params  # type: ignore[method-assign]
    data = engine_api.serialize_named_tensors([("a", torch.ones(2, 2))], flattened_bucket=True)
    timings: dict[str, float] = {}
    assert load_serialized_tensors(engine, data, "flattened_bucket", timings) == 1
    assert torch.equal(params["a"], torch.ones(2, 2)) and not params["b"].any()
    assert list(timings) == ["decode_ms", "copy_ms", "sync_ms", "release_ms"]


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
