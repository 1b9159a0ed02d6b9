"""training.offloadOptimizer on CUDA with megatron-core's real DistributedOptimizer (bf16 params, fp32
main params, fused AdamW): the optimizer step streamed chunk by chunk from pinned host memory
(``trainer/megatron/optimizer_offload.py``) equals the step with the state on the GPU, bit for bit,
and between steps the GPU no longer holds the main params and moments."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer_offload_gpu import _spec, _state, _step


def test_streamed_optimizer_step_equals_the_resident_one(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    from model_dirs import write_model_dir

    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank
    from rljob_runtime.trainer.megatron.optimizer_offload import OptimizerStateOffload

    model = write_model_dir(tmp_path / "model", "tiny", seed=4)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rank: Any = MegatronTrainerRank(_spec(model, "megatron"), str(model))
    rank.init_process_group("127.0.0.1", port)
    _step(rank)  # the optimizer has its moments now
    saved, step = [t.detach().clone() for t in _state(rank)], rank.step
    straight = _step(rank)
    after_straight = [t.detach().clone() for t in _state(rank)]
    with torch.no_grad():
        for t, s in zip(_state(rank), saved, strict=True):
            t.copy_(s)
    rank.step = step
    torch.cuda.synchronize()
    resident_gb = rank.memory_use()["allocated_gb"]  # the clones above included: measured just before

    # Small chunks, so the tiny model's step is several chunks (as a 4B's is with 2 GiB ones).
    offload = OptimizerStateOffload(rank.optimizer, chunk_bytes=1 << 20).install()
    rank.optimizer_offload = offload
    torch.cuda.synchronize()
    state_bytes = offload.host_bytes()
    offloaded_gb = rank.memory_use()["allocated_gb"]
    print(
        f"resident {resident_gb:.3f} GB, state offloaded {offloaded_gb:.3f} GB, "
        f"{state_bytes / 1e9:.3f} GB of state in {len(offload.chunks())} chunks",
        flush=True,
    )
    assert offload.device_bytes() == 0 and len(offload.chunks()) >= 3
    assert resident_gb - offloaded_gb >= 0.9 * state_bytes / 1e9

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    again = _step(rank)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9
    print(f"the step's peak {peak_gb:.3f} GB", flush=True)
    # Streamed: never the whole state at once (the chunks in flight are a fraction of it).
    assert peak_gb - offloaded_gb < 0.6 * state_bytes / 1e9
    assert offload.device_bytes() == 0 and offload.stats.steps == 1
    assert again == straight
    with offload.resident():  # the main params and moments too (checkpoints read them like this)
        assert all(torch.equal(a, b) for a, b in zip(_state(rank), after_straight, strict=True))
    rank.shutdown()
