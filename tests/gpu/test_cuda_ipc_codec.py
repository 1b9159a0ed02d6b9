"""The CUDA IPC bucket codecs between two processes on one GPU: a producer shares buckets
(``cuda_ipc.IpcProducer``, at most two alive) and a consumer reads them as the engine does:

- ``sglang``: with SGLang's own ``MultiprocessingSerializer.deserialize`` and
  ``FlattenedTensorBucket.reconstruct_tensors`` (what its weight updater calls), after its
  ``monkey_patch_torch_reductions``;
- ``rljob``: with our hf engine's decoder (``cuda_ipc.decode_bucket``).

Every tensor arrives bit for bit, cast to the engines' dtype where floating."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch


def _named() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        ("embed", torch.randn(300, 64, generator=gen)),
        ("norm", torch.randn(64, generator=gen)),
        ("q", torch.randn(64, 64, generator=gen).t()),  # strided
        ("ids", torch.arange(10, dtype=torch.int64)),
        ("k", torch.randn(32, 64, generator=gen)),
    ]


def _consumer(codec: str, inbox: Any, outbox: Any) -> None:
    import base64

    while (payload := inbox.get()) is not None:
        if codec == "sglang":
            from sglang.srt.utils import MultiprocessingSerializer
            from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
            from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

            monkey_patch_torch_reductions()
            data = MultiprocessingSerializer.deserialize(payload)
            named = FlattenedTensorBucket(
                flattened_tensor=data["flattened_tensor"], metadata=data["metadata"]
            ).reconstruct_tensors()
        else:
            from rljob_runtime.sync.cuda_ipc import decode_bucket

            named = decode_bucket(base64.b64decode(payload))
        copies = {n: t.clone().cpu() for n, t in named}
        torch.cuda.synchronize()
        del named
        outbox.put(copies)


@pytest.mark.parametrize("codec", ["sglang", "rljob"])
def test_buckets_arrive_bit_exact_in_another_process(codec: str) -> None:
    if codec == "sglang":
        pytest.importorskip("sglang.srt.weight_sync.tensor_bucket")
    from rljob_runtime.sync.buckets import plan_buckets
    from rljob_runtime.sync.cuda_ipc import IpcProducer

    named = [(n, t.cuda()) for n, t in _named()]
    plan = plan_buckets(named, 20_000, cast=torch.bfloat16)  # several buckets, one larger than the limit
    assert len(plan) >= 3
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_consumer, args=(codec, inbox, outbox))
    consumer.start()
    producer = IpcProducer(plan, codec, torch.bfloat16)
    got: dict[str, torch.Tensor] = {}
    try:
        for index in range(len(plan)):
            inbox.put(producer.share(index))
            got.update(outbox.get(timeout=120))
            assert producer.alive_bytes <= 2 * max(sum(t.numel() * 2 for _, t in items) for items in plan)
    finally:
        inbox.put(None)
        consumer.join(timeout=60)
        producer.release()
    for name, tensor in named:
        want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert got[name].dtype == want.dtype and torch.equal(got[name], want.cpu()), name
