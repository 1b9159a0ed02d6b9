"""A rollout that is one global batch trains without the no-grad log-prob pass before it: its one
optimizer step starts from the policy that generated the old log-probs, so the step's own forward
gives them. The gradients and metrics must be those of the two-pass computation, on a tiny random
Llama in float32 on CPU; where the pass is still needed (several steps, a reference model, a critic)
it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from packing_cases import advantages_for, long_tail_samples, save_tiny_llama  # noqa: E402

from rljob_api.spec import RLTrainingJobSpec  # noqa: E402
from rljob_runtime import driver  # noqa: E402
from rljob_runtime.data.sample import Sample  # noqa: E402
from rljob_runtime.trainer.base import LogProbs, TrainBatch, build_batch  # noqa: E402
from rljob_runtime.trainer.rank_base import skips_logprobs_pass  # noqa: E402
from rljob_runtime.trainer.torch_backend import TorchTrainerRank  # noqa: E402

VOCAB = 300


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), VOCAB)


def make_spec(model: Path, global_batch: int = 8, **algorithm: Any) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/unused.jsonl", "maxPromptLength": 20},
            "algorithm": {"advantageEstimator": "grpo", "entropyCoef": 0.01, **algorithm},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4, "maxResponseLen": 28},
            "training": {"backend": "torch", "globalBatchSize": global_batch, "microBatchSize": 2},
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )


def test_the_pass_goes_only_for_one_step_without_reference_or_critic(model_dir: Path) -> None:
    assert skips_logprobs_pass(make_spec(model_dir), 8)
    assert not skips_logprobs_pass(make_spec(model_dir), 16)  # two steps: the second is off-policy
    assert not skips_logprobs_pass(make_spec(model_dir, global_batch=4), 8)
    assert not skips_logprobs_pass(make_spec(model_dir), 4)  # fewer samples (dynamic sampling)
    assert not skips_logprobs_pass(make_spec(model_dir, useKLLoss=True, klLossCoef=0.1), 8)
    assert skips_logprobs_pass(make_spec(model_dir, advantageEstimator="reinforce_plus_plus"), 8)
    spec = make_spec(model_dir, advantageEstimator="reinforce_plus_plus", klCoef=0.05)
    assert not skips_logprobs_pass(spec, 8)  # its reward shaping needs the reference
    assert not skips_logprobs_pass(make_spec(model_dir, advantageEstimator="ppo"), 8)  # values


def one_step(rank: TorchTrainerRank, b: TrainBatch, old_logp: torch.Tensor | None) -> dict[str, Any]:
    """The metrics of one optimizer step and the parameters after it."""
    metrics = rank.train(b, advantages_for(b.size, b.width) * b.loss_mask, old_logp)
    return {"metrics": metrics, "params": {n: p.detach().clone() for n, p in rank.model.named_parameters()}}


@pytest.mark.parametrize("tis", [False, True], ids=["plain", "tis"])
def test_one_pass_trains_exactly_as_two(model_dir: Path, tis: bool) -> None:
    spec = make_spec(model_dir, tis={"enabled": tis})
    b = build_batch(long_tail_samples(VOCAB))
    two_pass = TorchTrainerRank(spec, str(model_dir))
    want = one_step(two_pass, b, two_pass.logprobs(b).logp)
    got = one_step(TorchTrainerRank(spec, str(model_dir)), b, None)
    assert got["metrics"]["ppo_kl"] == want["metrics"]["ppo_kl"] == 0.0
    for key, value in want["metrics"].items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    moved = 0
    for name, before in TorchTrainerRank(spec, str(model_dir)).model.named_parameters():
        torch.testing.assert_close(got["params"][name], want["params"][name], rtol=1e-5, atol=1e-7, msg=name)
        moved += int(not torch.equal(before.detach(), want["params"][name]))
    assert moved > 0  # the step changed the weights


def test_a_rollout_of_two_steps_refuses_to_train_without_old_logprobs(model_dir: Path) -> None:
    rank = TorchTrainerRank(make_spec(model_dir, global_batch=4), str(model_dir))
    b = build_batch(long_tail_samples(VOCAB))
    with pytest.raises(ValueError, match="old_logp is needed for a rollout of 2 optimizer steps"):
        rank.train(b, advantages_for(b.size, b.width) * b.loss_mask, None)


class RecordingTrainer:
    """What the driver's train step asks of a trainer: whether it ran the log-prob pass, and what it
    handed to train (a test double of TrainerGroup, which needs Ray)."""

    def __init__(self, rank: TorchTrainerRank) -> None:
        self.rank, self.passes, self.old_logp = rank, 0, "unset"

    def logprobs(self, samples: list[Sample]) -> LogProbs:
        self.passes += 1
        return self.rank.logprobs(build_batch(samples))

    def train(self, samples: list[Sample], advantages: torch.Tensor, old_logp: Any, *a: Any, **k: Any) -> Any:
        self.old_logp = old_logp
        return self.rank.train(build_batch(samples), advantages, old_logp, *a, **k)


@pytest.mark.parametrize(("global_batch", "passes"), [(8, 0), (4, 1)])
def test_the_drivers_step_runs_the_pass_only_where_it_is_needed(
    model_dir: Path, global_batch: int, passes: int
) -> None:
    spec = make_spec(model_dir, global_batch=global_batch)
    samples = long_tail_samples(VOCAB)
    for i, s in enumerate(samples):
        s.reward = float(i % 3)  # groups of 4 with different rewards: nonzero advantages
    trainer = RecordingTrainer(TorchTrainerRank(spec, str(model_dir)))
    metrics = driver._train(spec, trainer, samples)  # type: ignore[arg-type]
    assert trainer.passes == passes
    assert (trainer.old_logp is None) == (passes == 0)
    assert metrics["loss"] != 0.0
    if passes == 0:
        assert metrics["ppo_kl"] == 0.0  # one step: on-policy by construction
