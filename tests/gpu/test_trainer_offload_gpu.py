"""A trainer rank's turn off the GPU and back (``trainer/offload.py``) on CUDA, both backends, one
process: after ``offload`` the rank holds a small fraction of its GPU memory, and the step after
``onload`` equals the step of a twin rank that never left (bit for bit)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")


def _spec(model: Path, backend: str) -> Any:
    from rljob_runtime.config import config_from_document

    return config_from_document(
        {
            "model": {"path": str(model), "dtype": "bfloat16"},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {"useKLLoss": True, "klLossCoef": 0.01},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2},
            "training": {"backend": backend, "globalBatchSize": 4, "microBatchSize": 2},
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    ).spec


def _batch() -> tuple[Any, torch.Tensor]:
    from rljob_runtime.data.sample import Sample
    from rljob_runtime.trainer.base import build_batch

    samples = [
        Sample(
            index=i,
            prompt_ids=[5 + i, 7, 9, 30],
            response_ids=[11, 12 + i, 13, 40 + i],
            loss_mask=[1, 1, 1, 1],
            rollout_logprobs=[-1.0] * 4,
        )
        for i in range(4)
    ]
    return build_batch(samples), torch.tensor([[1.0] * 4, [-1.0] * 4, [0.5] * 4, [-0.5] * 4])


def _step(rank: Any) -> dict[str, float]:
    batch, advantages = _batch()
    lp = rank.logprobs(batch)
    return rank.train(batch, advantages, lp.logp, lp.ref_logp)


def _rank(backend: str, model: Path) -> Any:
    spec = _spec(model, backend)
    if backend == "torch":
        from rljob_runtime.trainer.torch_backend import TorchTrainerRank

        return TorchTrainerRank(spec, str(model))
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rank = MegatronTrainerRank(spec, str(model))
    rank.init_process_group("127.0.0.1", port)  # one NCCL rank
    return rank


def _state(rank: Any) -> list[torch.Tensor]:
    from rljob_runtime.trainer.offload import module_tensors, optimizer_tensors

    model = getattr(rank.model, "module", rank.model)  # megatron: inside DDP
    return [*module_tensors(model), *optimizer_tensors(rank.optimizer)]


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_offload_frees_the_gpu_and_the_next_step_is_the_same(backend: str, tmp_path: Path) -> None:
    """Step 2 is taken twice from the same state: once straight, once after offload + onload."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    from model_dirs import write_model_dir

    rank = _rank(backend, write_model_dir(tmp_path / "model", "tiny", seed=4))
    _step(rank)  # the optimizer has state now
    saved, step = [t.detach().clone() for t in _state(rank)], rank.step
    straight = _step(rank)
    after_straight = [t.detach().clone() for t in _state(rank)]
    with torch.no_grad():
        for t, s in zip(_state(rank), saved, strict=True):
            t.copy_(s)
    rank.step = step
    torch.cuda.synchronize()
    resident = rank.memory_use()
    offloaded = rank.offload()
    back = rank.onload()
    print(f"{backend}: resident {resident}, offloaded {offloaded}, back {back}", flush=True)
    assert offloaded["bytes"] > 0 and back["bytes"] >= offloaded["bytes"]
    assert offloaded["allocated_gb"] < 0.1 * resident["allocated_gb"], (resident, offloaded)
    again = _step(rank)
    assert again == straight
    assert all(torch.equal(a, b) for a, b in zip(_state(rank), after_straight, strict=True))
