"""training.dynamicBatch on the torch backend: a tiny random Llama in float32 on CPU, rows of very
different lengths packed into token-budget micro-batches give the log-probs, entropy, reference
log-probs, critic values, loss metrics and every parameter gradient of the padded computation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from packing_cases import advantages_for, long_tail_samples, save_tiny_llama  # noqa: E402

from rljob_api.spec import RLTrainingJobSpec  # noqa: E402
from rljob_runtime.trainer.base import TrainBatch, build_batch  # noqa: E402
from rljob_runtime.trainer.torch_backend import TorchTrainerRank  # noqa: E402

VOCAB = 300
BUDGET = 48  # tokens per packed micro-batch: the 8 rows (3..40 tokens, 172 in all) take 4 or 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), VOCAB)


def make_spec(model: Path, *, dynamic: bool, estimator: str = "grpo") -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/unused.jsonl", "maxPromptLength": 20},
            "algorithm": {
                "advantageEstimator": estimator,
                "useKLLoss": True,
                "klLossCoef": 0.1,
                "entropyCoef": 0.01,  # entropy's gradient too
                "lossReduction": "token",
            },
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4, "maxResponseLen": 28},
            "training": {
                "backend": "torch",
                "globalBatchSize": 8,
                "microBatchSize": 1 if dynamic else 2,  # dynamic: the token budget sizes them
                "dynamicBatch": {"enabled": dynamic, "maxTokensPerGpu": BUDGET},
            },
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )


def batch() -> TrainBatch:
    return build_batch(long_tail_samples(VOCAB))


def grads_of_one_step(
    rank: TorchTrainerRank, b: TrainBatch
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One optimizer step's metrics and the all-reduced gradients it stepped with (before clipping)."""
    seen: dict[str, torch.Tensor] = {}
    update = rank._update

    def record(params: Any, optimizer: Any, opt: Any) -> tuple[float, float, bool]:
        if optimizer is rank.optimizer:
            names = {id(p): n for n, p in rank.model.named_parameters()}
            seen.update({names[id(p)]: p.grad.detach().clone() for p in params if p.grad is not None})
        return update(params, optimizer, opt)

    rank._update = record  # type: ignore[method-assign]
    lp = rank.logprobs(b)
    adv = advantages_for(b.size, b.width)
    metrics = rank.train(b, adv * b.loss_mask, lp.logp, lp.ref_logp)
    return metrics, seen


def test_the_plan_packs_several_rows_per_micro_batch_within_the_budget(model_dir: Path) -> None:
    b = batch()
    rank = TorchTrainerRank(make_spec(model_dir, dynamic=True), str(model_dir))
    (step,) = rank._plan(b, strict=True)
    lengths = b.sequence_lengths()
    assert sorted(r for mb in step for r in mb) == list(range(8))  # type: ignore[union-attr]
    assert all(sum(lengths[r] for r in mb) <= BUDGET for mb in step)  # type: ignore[union-attr]
    assert max(len(mb) for mb in step) >= 2  # type: ignore[arg-type]  # rows share a pass: leaks would show
    assert len(step) < b.size


def test_packed_logprobs_equal_padded(model_dir: Path) -> None:
    b = batch()
    padded = TorchTrainerRank(make_spec(model_dir, dynamic=False), str(model_dir)).logprobs(b)
    packed = TorchTrainerRank(make_spec(model_dir, dynamic=True), str(model_dir)).logprobs(b)
    for name in ("logp", "ref_logp", "entropy"):
        want, got = getattr(padded, name), getattr(packed, name)
        assert got.shape == want.shape == (8, b.width)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
    assert bool((packed.logp * b.response_mask()).abs().sum() > 0)


def test_packed_critic_values_equal_padded(model_dir: Path) -> None:
    b = batch()
    padded = TorchTrainerRank(make_spec(model_dir, dynamic=False, estimator="ppo"), str(model_dir)).logprobs(
        b
    )
    packed = TorchTrainerRank(make_spec(model_dir, dynamic=True, estimator="ppo"), str(model_dir)).logprobs(b)
    assert padded.values is not None and packed.values is not None
    torch.testing.assert_close(packed.values, padded.values, rtol=1e-5, atol=1e-5)


def test_packed_loss_and_every_gradient_equal_padded(model_dir: Path) -> None:
    b = batch()
    padded = TorchTrainerRank(make_spec(model_dir, dynamic=False), str(model_dir))
    m_pad, g_pad = grads_of_one_step(padded, b)
    m_pack, g_pack = grads_of_one_step(
        TorchTrainerRank(make_spec(model_dir, dynamic=True), str(model_dir)), b
    )
    assert m_pack["ppo_kl"] == 0.0  # logprobs and train ran the same micro-batches: on-policy exactly
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "tokens"):
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-5, abs=1e-6), key
    assert set(g_pack) == set(g_pad) == {n for n, _ in padded.model.named_parameters()}
    for name, want in g_pad.items():
        torch.testing.assert_close(g_pack[name], want, rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(g.abs().max()) > 1e-4 for g in g_pad.values())


def test_rows_in_one_pack_would_see_each_other_without_the_packed_mask(model_dir: Path) -> None:
    """The control: the same packed ids and positions with an explicit all-ones mask (which turns
    transformers' packed-sequence detection off) let later rows attend to earlier ones, and their
    log-probs move; so the equality above is the block-causal mask at work, not luck."""
    b = batch().select([0, 1, 2])
    rank = TorchTrainerRank(make_spec(model_dir, dynamic=True), str(model_dir))
    packed = b.packed()
    with torch.no_grad():
        masked = rank.model(input_ids=packed.input_ids, position_ids=packed.position_ids).logits
        leaky = rank.model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=torch.ones_like(packed.input_ids),
        ).logits
        alone = rank.model(input_ids=b.select([1]).input_ids).logits
    second = slice(int(packed.cu_seqlens[1]), int(packed.cu_seqlens[2]))
    torch.testing.assert_close(masked[0, second], alone[0], rtol=1e-5, atol=1e-5)
    assert float((leaky[0, second] - alone[0]).abs().max()) > 1e-3
