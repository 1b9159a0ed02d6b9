"""Policy and value losses: each term against hand-computed values, the on-policy check, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rljob_api.spec_algorithm import AlgorithmSpec
from rljob_runtime.algo.logprobs import entropy_from_logits, token_logprobs
from rljob_runtime.algo.losses import clipped_pg, log_ratio, policy_loss, tis_weights, value_loss
from rljob_runtime.algo.masked import reduce_loss


def _logps(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.full((len(ratios), len(ratios[0])), -1.0)
    return old + torch.log(torch.tensor(ratios)), old


def test_clip_positive_and_negative_advantages() -> None:
    ratio = torch.tensor([1.5, 0.5])
    # A = +1: max(-1.5, -1.2) = -1.2 (clipped), max(-0.5, -0.8) = -0.5
    loss, clipped, _ = clipped_pg(ratio, torch.ones(2), 0.2, 0.2, None)
    assert torch.allclose(loss, torch.tensor([-1.2, -0.5])) and clipped.tolist() == [True, False]
    # A = -1: max(1.5, 1.2) = 1.5, max(0.5, 0.8) = 0.8 (clipped)
    loss, clipped, _ = clipped_pg(ratio, -torch.ones(2), 0.2, 0.2, None)
    assert torch.allclose(loss, torch.tensor([1.5, 0.8])) and clipped.tolist() == [False, True]


def test_clip_higher() -> None:
    loss, clipped, _ = clipped_pg(torch.tensor([1.25, 1.3]), torch.ones(2), 0.2, 0.28, None)
    assert torch.allclose(loss, torch.tensor([-1.25, -1.28])) and clipped.tolist() == [False, True]


def test_dual_clip_bounds_negative_advantages() -> None:
    # A = -1, ratio 4: PPO loss max(4, 1.2) = 4, dual clip min(4, 3) = 3; ratio 0.5 keeps 0.8
    loss, _, dual = clipped_pg(torch.tensor([4.0, 0.5]), -torch.ones(2), 0.2, 0.2, 3.0)
    assert torch.allclose(loss, torch.tensor([3.0, 0.8])) and dual.tolist() == [True, False]
    # positive advantages are untouched by the dual clip
    loss, _, dual = clipped_pg(torch.tensor([4.0]), torch.ones(1), 0.2, 0.2, 3.0)
    assert loss.tolist() == [pytest.approx(-1.2)] and not dual.any()


def test_reductions() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # 3rd sample: no tokens
    assert reduce_loss(x, mask, "token").item() == pytest.approx(10 / 4)
    assert reduce_loss(x, mask, "sample").item() == pytest.approx((2 + 4) / 2)
    assert reduce_loss(x, mask, "token", denominator=8).item() == pytest.approx(10 / 8)
    assert reduce_loss(x, mask, "sample", denominator=4).item() == pytest.approx(6 / 4)


def test_gspo_sequence_ratio() -> None:
    logp, old = _logps([[2.0, 1.0], [2.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ratio = torch.exp(log_ratio(logp, old, mask, sequence_level=True))
    # sample 0: exp((ln 2 + 0) / 2) = sqrt 2 on both tokens; sample 1: masked token ignored -> 2
    assert torch.allclose(ratio, torch.tensor([[math.sqrt(2)] * 2, [2.0, 2.0]]))
    spec = AlgorithmSpec(advantageEstimator="gspo", lossReduction="token")
    loss, m = policy_loss(spec, logp, old, torch.ones(2, 2), mask)
    assert loss.item() == pytest.approx(-1.2) and m["pg_clipfrac"].item() == 1.0


def test_tis_weights_and_metrics() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0]])
    rollout = -torch.log(torch.tensor([[3.0, 0.5, 1.0]]))  # exp(old - rollout) = 3, 0.5, 1
    w, clipped = tis_weights(old, rollout, 0.0, 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0]])) and clipped.tolist() == [[True, False, False]]
    spec = AlgorithmSpec(tis={"enabled": True}, lossReduction="token")
    loss, m = policy_loss(spec, old.clone(), old, torch.ones(1, 3), torch.ones(1, 3), rollout_logp=rollout)
    # on-policy ratio 1, A = 1: pg = -w, token mean -(2 + 0.5 + 1) / 3
    assert loss.item() == pytest.approx(-3.5 / 3)
    assert m["tis_weight_mean"].item() == pytest.approx(3.5 / 3)
    assert m["tis_clipfrac"].item() == pytest.approx(1 / 3)
    # the engine/trainer mismatch: mean |old - rollout| = (log 3 + log 2 + 0) / 3, with TIS or without
    diff = (torch.log(torch.tensor(3.0)) + torch.log(torch.tensor(2.0))).item() / 3
    assert m["rollout_logp_abs_diff"].item() == pytest.approx(diff)
    plain = AlgorithmSpec(lossReduction="token")
    _, m = policy_loss(
        plain, old.clone(), old, torch.ones(1, 3), torch.tensor([[1.0, 1.0, 0.0]]), rollout_logp=rollout
    )
    assert m["rollout_logp_abs_diff"].item() == pytest.approx(diff * 3 / 2)  # the masked token is left out
    _, m = policy_loss(plain, old.clone(), old, torch.ones(1, 3), torch.ones(1, 3))
    assert "rollout_logp_abs_diff" not in m
    with pytest.raises(ValueError, match="rollout log-probs"):
        policy_loss(spec, old, old, torch.ones(1, 3), torch.ones(1, 3))


def test_full_loss_entropy_and_kl_terms() -> None:
    logp, old = _logps([[1.5, 0.5]])
    ref = logp.detach() - torch.tensor([[1.0, -1.0]])  # logp - ref = [1, -1]
    entropy = torch.tensor([[0.5, 1.5]])
    spec = AlgorithmSpec(
        entropyCoef=0.1, useKLLoss=True, klLossCoef=0.5, klLossType="k3", lossReduction="token"
    )
    loss, m = policy_loss(spec, logp, old, torch.ones(1, 2), torch.ones(1, 2), entropy=entropy, ref_logp=ref)
    pg = (-1.2 - 0.5) / 2
    kl = (math.exp(-1) + math.e - 2) / 2  # k3 at +1 and -1
    assert m["pg_loss"].item() == pytest.approx(pg)
    assert m["pg_clipfrac"].item() == 0.5
    assert m["entropy"].item() == pytest.approx(1.0)
    assert m["kl_loss"].item() == pytest.approx(kl, rel=1e-5)
    assert loss.item() == pytest.approx(pg - 0.1 * 1.0 + 0.5 * kl, rel=1e-5)
    # ppo_kl = mean(old - logp) = -(ln 1.5 + ln 0.5) / 2
    assert m["ppo_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 2, rel=1e-5)


def test_missing_inputs_are_errors() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="reference model"):
        policy_loss(AlgorithmSpec(useKLLoss=True, klLossCoef=0.1), z, z, z, torch.ones(1, 2))
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(AlgorithmSpec(entropyCoef=0.1), z, z, z, torch.ones(1, 2))


@pytest.mark.parametrize("estimator", ["grpo", "gspo"])
@pytest.mark.parametrize("reduction", ["sample", "token"])
def test_first_on_policy_step_has_zero_kl_and_clipfrac(estimator: str, reduction: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 5))
    old = token_logprobs(logits, tokens).detach()  # what the trainer computed before the update
    logp = token_logprobs(logits, tokens)
    spec = AlgorithmSpec(
        advantageEstimator=estimator, lossReduction=reduction, epsClipC=3.0, tis={"enabled": True}
    )
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    _, m = policy_loss(spec, logp, old, torch.randn(3, 5), mask, rollout_logp=old)
    assert m["ppo_kl"].item() == 0.0
    assert m["pg_clipfrac"].item() == 0.0 and m["pg_dual_clipfrac"].item() == 0.0
    assert m["tis_clipfrac"].item() == 0.0 and m["tis_weight_mean"].item() == 1.0


def test_gradients_flow_to_logits() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 7, requires_grad=True)
    tokens = torch.randint(0, 7, (2, 4))
    logp = token_logprobs(logits, tokens)
    old = logp.detach() + 0.05 * torch.randn(2, 4)
    ref = logp.detach() - 0.1
    spec = AlgorithmSpec(entropyCoef=0.01, useKLLoss=True, klLossCoef=0.1, epsClipHigh=0.28)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4]) * mask
    loss, _ = policy_loss(spec, logp, old, adv, mask, entropy=entropy_from_logits(logits), ref_logp=ref)
    loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert logits.grad[0, :3].abs().sum() > 0
    assert logits.grad[0, 3].abs().sum() == 0  # a masked token gets no gradient


def test_on_policy_pg_gradient_by_hand() -> None:
    # At ratio 1, d(-A * ratio)/d logp = -A; token reduction divides by the 3 masked tokens.
    logp = torch.zeros(1, 4, requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 0.5, 9.0]])
    loss, _ = policy_loss(
        AlgorithmSpec(lossReduction="token"), logp, logp.detach(), adv, torch.tensor([[1, 1, 1, 0]])
    )
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, 1 / 3, -0.5 / 3, 0.0]]))


def test_logprobs_and_entropy_by_hand() -> None:
    logits = torch.zeros(1, 1, 4)  # uniform over 4
    assert token_logprobs(logits, torch.tensor([[2]])).item() == pytest.approx(-math.log(4))
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    peaked = torch.tensor([[[0.0, math.log(3.0)]]])  # p = [1/4, 3/4]
    assert entropy_from_logits(peaked).item() == pytest.approx(
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    )


def test_value_loss_clipping() -> None:
    values = torch.tensor([[1.0, 2.0]], requires_grad=True)
    old, returns = torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]])
    # clipped values 0.5 + clip([0.5, 1.5], +-0.2) = [0.7, 0.7]; errors unclipped [0, 4], clipped
    # [0.09, 0.49]; max [0.09, 4]; 0.5 * mean = 1.0225
    loss, m = value_loss(values, old, returns, torch.ones(1, 2), value_clip=0.2)
    assert loss.item() == pytest.approx(1.0225) and m["value_clipfrac"].item() == 0.5
    loss.backward()
    assert values.grad.tolist() == [[0.0, pytest.approx(1.0)]]  # the clipped token has no gradient


def test_value_loss_masked_sample_reduction_with_a_global_denominator() -> None:
    # On-policy (values == old values): nothing is clipped; sample reduction over the masked tokens.
    values = torch.tensor([[1.0, 3.0, 8.0], [2.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # squared errors: sample 0 [1, 4] -> mean 2.5; sample 1 [4] -> 4; 0.5 * (2.5 + 4) / 2 = 1.625
    loss, m = value_loss(values, values, returns, mask, value_clip=0.2, reduction="sample")
    assert loss.item() == pytest.approx(1.625) and m["value_clipfrac"].item() == 0.0
    assert m["value_mean"].item() == pytest.approx(2.0)  # (1 + 3 + 2) / 3, padding ignored
    # as one micro-batch of a global batch of 4 samples: the sum is divided by 4
    part, _ = value_loss(values, values, returns, mask, value_clip=0.2, reduction="sample", denominator=4)
    assert part.item() == pytest.approx(0.5 * 6.5 / 4)
