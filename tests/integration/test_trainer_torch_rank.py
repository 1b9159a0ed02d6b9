"""One torch trainer rank in-process (no Ray, world size 1) on a random 2-layer model: on-policy
first step, gradient accumulation, the reference model and KL loss, the ppo critic. About 15 s on
2 cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.algo.advantages import compute_advantages
from rljob_runtime.data.sample import Sample
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.trainer.base import build_batch
from rljob_runtime.trainer.torch_backend import TorchTrainerRank


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def make_spec(model: Path, micro_batch_size: int = 1, **algorithm: Any) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/unused.jsonl"},
            "algorithm": algorithm,
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2, "temperature": 0.8},
            "training": {
                "backend": "torch",
                "globalBatchSize": 4,
                "microBatchSize": micro_batch_size,
                "optimizer": {"lr": 1e-4, "clipGrad": 0.0},
            },
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )


def make_samples(seed: int = 0) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        prompt = torch.randint(100, 5000, (3 + i % 2,), generator=gen).tolist()
        response = torch.randint(100, 5000, (2 + 2 * i,), generator=gen).tolist()
        mask = [1] * len(response)
        if i == 3:
            mask[1] = 0  # e.g. a tool output inside the response
        out.append(Sample(group_index=i // 2, prompt_ids=prompt, response_ids=response, loss_mask=mask))
    return out


ADV = torch.tensor([1.0, -1.0, -1.0, 1.0])


def advantages(samples: list[Sample]) -> torch.Tensor:
    return ADV[:, None] * build_batch(samples).loss_mask


def test_first_step_is_on_policy_and_moves_logprobs_with_the_advantage(tiny_model: Path) -> None:
    rank = TorchTrainerRank(make_spec(tiny_model), str(tiny_model))
    samples = make_samples()
    batch = build_batch(samples)
    before = rank.logprobs(batch)
    assert before.ref_logp is None
    assert before.logp.shape == (4, batch.width)
    assert torch.all(before.logp[batch.response_mask() == 0] == 0)
    metrics = rank.train(batch, advantages(samples), before.logp)
    assert metrics["ppo_kl"] == 0.0
    assert metrics["pg_clipfrac"] == 0.0
    assert metrics["lr"] == pytest.approx(1e-4)
    assert metrics["tokens"] == float(batch.loss_mask.sum())
    after = rank.logprobs(batch)
    delta = ((after.logp - before.logp) * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1)
    assert torch.all(torch.sign(delta) == ADV), delta
    # Second rollout, same data, now off-policy: the loss went down.
    again = rank.train(batch, advantages(samples), before.logp)
    assert again["loss"] < metrics["loss"]
    assert again["ppo_kl"] != 0.0


@pytest.mark.parametrize("reduction", ["sample", "token"])
def test_micro_batches_add_up_to_the_global_batch(tiny_model: Path, reduction: str) -> None:
    """microBatchSize 1 (gradient accumulation over 4) and 4 (one pass) take the same step."""
    samples = make_samples(1)
    batch = build_batch(samples)
    results = []
    for mbs in (1, 4):
        rank = TorchTrainerRank(make_spec(tiny_model, mbs, lossReduction=reduction), str(tiny_model))
        old = rank.logprobs(batch).logp
        metrics = rank.train(batch, advantages(samples), old)
        results.append((metrics, rank.named_tensors()))
    (m1, w1), (m4, w4) = results
    for key in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert m1[key] == pytest.approx(m4[key], rel=1e-4, abs=1e-6), key
    for name in w1:
        torch.testing.assert_close(w1[name], w4[name], rtol=1e-4, atol=1e-6)


def test_reference_model_and_kl_loss(tiny_model: Path) -> None:
    spec = make_spec(tiny_model, 2, useKLLoss=True, klLossCoef=0.1, klLossType="k3", entropyCoef=0.01)
    rank = TorchTrainerRank(spec, str(tiny_model))
    samples = make_samples(2)
    batch = build_batch(samples)
    first = rank.logprobs(batch)
    assert first.ref_logp is not None and first.entropy is not None
    assert torch.equal(first.ref_logp, first.logp)
    assert torch.all(first.entropy[batch.response_mask() > 0] > 0)
    with pytest.raises(ValueError, match="useKLLoss needs ref_logp"):
        rank.train(batch, advantages(samples), first.logp)
    metrics = rank.train(batch, advantages(samples), first.logp, first.ref_logp)
    assert metrics["kl_loss"] == 0.0
    second = rank.logprobs(batch)
    assert second.ref_logp is not None
    assert torch.equal(second.ref_logp, first.ref_logp)  # the reference stays frozen
    metrics = rank.train(batch, advantages(samples), second.logp, second.ref_logp)
    assert metrics["kl_loss"] > 0.0


def test_tis_uses_the_samples_rollout_logprobs(tiny_model: Path) -> None:
    spec = make_spec(tiny_model, 4, tis={"enabled": True, "clipLow": 0.0, "clipHigh": 2.0})
    rank = TorchTrainerRank(spec, str(tiny_model))
    samples = make_samples(3)
    old = rank.logprobs(build_batch(samples)).logp
    for i, sample in enumerate(samples):  # the engine's log-probs: here a bit off from the trainer's
        sample.rollout_logprobs = (old[i, : len(sample.response_ids)] - 0.1).tolist()
    batch = build_batch(samples)
    assert batch.rollout_logp is not None
    metrics = rank.train(batch, advantages(samples), old)
    assert metrics["tis_weight_mean"] == pytest.approx(torch.exp(torch.tensor(0.1)).item(), rel=1e-5)
    assert metrics["tis_clipfrac"] == 0.0
    assert metrics["ppo_kl"] == 0.0
    for sample in samples:
        sample.rollout_logprobs = None
    with pytest.raises(ValueError, match="needs the rollout log-probs"):
        rank.train(build_batch(samples), advantages(samples), old)


def _ppo_step(rank: TorchTrainerRank, samples: list[Sample], rewards: torch.Tensor) -> dict[str, float]:
    """What the driver does for ppo: values with the log-probs, GAE, then policy and critic steps."""
    batch = build_batch(samples)
    lp = rank.logprobs(batch)
    assert lp.values is not None
    adv = compute_advantages(rank.spec.algorithm, rewards, batch.loss_mask, 2, values=lp.values)
    return rank.train(batch, adv.advantages, lp.logp, values=lp.values, returns=adv.returns)


def test_ppo_critic_trains_and_resumes_bit_for_bit(tiny_model: Path, tmp_path: Path) -> None:
    spec = make_spec(
        tiny_model, 2, advantageEstimator="ppo", gamma=0.9, critic={"lr": 1e-3, "valueClip": 0.5}
    )
    rank = TorchTrainerRank(spec, str(tiny_model))
    samples = make_samples(4)
    batch = build_batch(samples)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    first = rank.logprobs(batch)
    assert first.values is not None and first.values.shape == first.logp.shape
    assert torch.all(first.values == 0)  # the value head of a causal-LM checkpoint starts at zero
    with pytest.raises(ValueError, match="critic's values and the returns"):
        rank.train(batch, advantages(samples), first.logp)

    metrics = _ppo_step(rank, samples, rewards)
    assert metrics["ppo_kl"] == 0.0 and metrics["value_clipfrac"] == 0.0  # both on-policy
    assert 0 < metrics["value_loss"] < float("inf") and metrics["critic_lr"] == pytest.approx(1e-3)
    assert metrics["critic_grad_norm"] > 0
    after = rank.logprobs(batch).values
    assert after is not None and not torch.all(after == 0)  # the critic learned
    assert torch.all(after[batch.response_mask() == 0] == 0)

    rank.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "critic" / "model.safetensors").exists()
    expected = _ppo_step(rank, samples, rewards)
    resumed = TorchTrainerRank(spec, str(tiny_model))
    resumed.load(str(tmp_path / "ckpt"))
    got = _ppo_step(resumed, samples, rewards)
    assert got == expected
    assert resumed.critic is not None and rank.critic is not None
    for name, tensor in rank.critic.state_dict().items():
        assert torch.equal(tensor, resumed.critic.state_dict()[name]), name
    for name, tensor in rank.named_tensors().items():
        assert torch.equal(tensor, resumed.named_tensors()[name]), name
