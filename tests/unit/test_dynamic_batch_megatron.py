"""training.dynamicBatch on the megatron backend, on CPU in float32 (gloo): rows of very different
lengths packed into token-budget micro-batches (GPTModel with PackedSeqParams "thd": RoPE restarting
per row, SdpaAttention attending within each row) give the log-probs, entropy, reference log-probs,
loss metrics and every parameter gradient of the padded micro-batches, on two ranks with tensor
parallelism 2 and with pipeline parallelism 2 (activation shapes then differ per micro-batch; the
stages send them first). One spawned pair of ranks runs both layouts: a test file well under a minute.
The CUDA kernel path (varlen attention, bf16) is tests/gpu/test_dynamic_batch_gpu.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from packing_cases import LENGTHS, advantages_for, long_tail_samples
from spawned_ranks import spawn_ranks
from test_megatron_reshard import CONFIG, cpu_training, trainer, write_model

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.trainer.base import TrainBatch, build_batch, rank_rows

BUDGET = 48  # the 8 rows (3..40 tokens) take 4 or 5 packed micro-batches


def make_spec(model: Path, *, dynamic: bool, tp: int = 1, pp: int = 1, gpus: int = 1) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/unused.jsonl", "maxPromptLength": 20},
            "algorithm": {
                "useKLLoss": True,
                "klLossCoef": 0.1,
                "entropyCoef": 0.01,
                "lossReduction": "token",
            },
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4, "maxResponseLen": 28},
            "training": {
                "backend": "megatron",
                "globalBatchSize": 8,
                "microBatchSize": 1 if dynamic else 2,  # dynamic: the token budget sizes them
                "parallelism": {"tensor": tp, "pipeline": pp},
                "dynamicBatch": {"enabled": dynamic, "maxTokensPerGpu": BUDGET},
                "optimizer": {"lr": 1e-3, "clipGrad": 0.0},
            },
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": gpus}},
        }
    )


def one_step(
    rank: Any, spec: RLTrainingJobSpec, lengths: tuple[tuple[int, int], ...] = LENGTHS
) -> dict[str, Any]:
    """Under ``spec``: logprobs, then one optimizer step on this rank's rows of ``long_tail_samples``
    (of ``lengths``) whose update is skipped (the same rank then runs the other spec from the same
    weights; one model build saved); the main grads it would have stepped with."""
    from megatron.core import parallel_state as ps

    rank.spec = spec
    full = build_batch(long_tail_samples(CONFIG["vocab_size"], lengths=lengths))
    rows = rank_rows(full.size, 8, ps.get_data_parallel_world_size(), ps.get_data_parallel_rank())
    batch: TrainBatch = full.select(rows)
    grads: dict[str, torch.Tensor] = {}

    def record() -> tuple[bool, float, None]:
        for name, p in rank.model.module.named_parameters():
            grads[name] = p.main_grad.detach().clone()
        return True, 0.0, None

    rank.optimizer.step = record
    lp = rank.logprobs(batch)
    adv = advantages_for(batch.size, batch.width) * batch.loss_mask
    metrics = rank.train(batch, adv, lp.logp, lp.ref_logp)
    return {"lp": lp, "metrics": metrics, "grads": grads, "plan": rank._plan(batch)}


def padded_and_packed(model: Path, rank: int = 0, world: int = 1, tp: int = 1, pp: int = 1) -> dict[str, Any]:
    spec = make_spec(model, dynamic=False, tp=tp, pp=pp, gpus=world)
    r = trainer(spec, model, rank, world)
    padded = one_step(r, spec)
    return {"padded": padded, "packed": one_step(r, make_spec(model, dynamic=True, tp=tp, pp=pp, gpus=world))}


def compare(padded: dict[str, Any], packed: dict[str, Any]) -> None:
    same_step(padded, packed)
    assert max(len(mb) for step in packed["plan"] for mb in step) >= 2  # rows shared a pass


def same_step(padded: dict[str, Any], packed: dict[str, Any]) -> None:
    """Two ``one_step`` results agree (the first the reference): log-probs, entropy, loss metrics and
    every gradient."""
    for name in ("logp", "ref_logp", "entropy"):
        torch.testing.assert_close(
            getattr(packed["lp"], name), getattr(padded["lp"], name), rtol=1e-5, atol=1e-5, msg=name
        )
    assert packed["metrics"]["ppo_kl"] == 0.0  # logprobs and train ran the same micro-batches
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "tokens"):
        assert packed["metrics"][key] == pytest.approx(padded["metrics"][key], rel=1e-5, abs=1e-6), key
    assert set(packed["grads"]) == set(padded["grads"]) and padded["grads"]
    for name, want in padded["grads"].items():
        torch.testing.assert_close(packed["grads"][name], want, rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("dyn-megatron") / "hf")


def _two_ranks(rank: int, port: int, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_training()
    results: dict[str, Any] = {}
    for name, (tp, pp) in (("tp2", (2, 1)), ("pp2", (1, 2))):
        results[name] = padded_and_packed(Path(model_dir), rank, 2, tp, pp)
    torch.save(results, Path(out) / f"result.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if torch.cuda.is_available():
        pytest.skip("CPU test (tests/gpu covers CUDA)")
    out = tmp_path_factory.mktemp("dyn-two")
    spawn_ranks(_two_ranks, str(model_dir), str(out))
    return [torch.load(out / f"result.{r}", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_packed_equals_padded_on_two_ranks(two_ranks: list[dict[str, Any]], layout: str) -> None:
    for rank in two_ranks:  # each rank's shard (TP) or stage (PP) of the gradients
        compare(rank[layout]["padded"], rank[layout]["packed"])
