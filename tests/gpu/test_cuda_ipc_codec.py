"""The CUDA IPC bucket codecs between two processes on one GPU: this process shares buckets
(``cuda_ipc.IpcProducer``, at most two alive) and a consumer process (``ipc_consumer.py``) reads them
as the engine does, with SGLang's own deserializer for the ``sglang`` codec. Every tensor arrives
bit for bit (exact checksums), cast to the engines' dtype where floating."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def _named() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        ("embed", torch.randn(300, 64, generator=gen)),
        ("norm", torch.randn(64, generator=gen)),
        ("q", torch.randn(64, 64, generator=gen).t()),  # strided
        ("ids", torch.arange(10, dtype=torch.int64)),
        ("k", torch.randn(32, 64, generator=gen)),
    ]


@pytest.mark.parametrize("codec", ["sglang", "rljob"])
def test_buckets_arrive_bit_exact_in_another_process(codec: str) -> None:
    if codec == "sglang":
        pytest.importorskip("sglang.srt.weight_sync.tensor_bucket")
    from rljob_runtime.sync.buckets import plan_buckets
    from rljob_runtime.sync.checksum import checksums
    from rljob_runtime.sync.cuda_ipc import IpcProducer

    named = [(n, t.cuda()) for n, t in _named()]
    plan = plan_buckets(named, 20_000, cast=torch.bfloat16)  # several buckets, one larger than the limit
    assert len(plan) >= 3
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path, os.environ.get("PYTHONPATH", "")])}
    consumer = subprocess.Popen(
        [sys.executable, str(HERE / "ipc_consumer.py"), codec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    producer = IpcProducer(plan, codec, torch.bfloat16)
    got: dict[str, list[int]] = {}
    try:
        assert consumer.stdin is not None and consumer.stdout is not None
        largest = max(sum(t.numel() * 8 for _, t in items) for items in plan)
        for index in range(len(plan)):
            consumer.stdin.write(producer.share(index) + "\n")
            consumer.stdin.flush()
            line = consumer.stdout.readline()
            while line and not line.startswith("RESULT "):
                line = consumer.stdout.readline()
            assert line, f"the consumer died: {consumer.stderr.read()[-3000:] if consumer.stderr else ''}"
            got.update(json.loads(line.removeprefix("RESULT ")))
            assert producer.alive_bytes <= 2 * largest
        consumer.stdin.write("END\n")
        consumer.stdin.flush()
        assert consumer.wait(timeout=60) == 0
    finally:
        if consumer.poll() is None:
            consumer.kill()
        producer.release()
    want = {
        n: list(v)
        for n, v in checksums(
            (n, t.to(torch.bfloat16) if t.is_floating_point() else t) for n, t in named
        ).items()
    }
    assert got == want
