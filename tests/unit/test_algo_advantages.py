"""Advantage estimators on small batches, numbers worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from rljob_api.spec_algorithm import AlgorithmSpec
from rljob_runtime.algo.advantages import (
    compute_advantages,
    discounted_returns,
    gae,
    group_normalize,
    grpo_advantages,
    ppo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    token_rewards,
)
from rljob_runtime.algo.masked import masked_explained_variance, masked_whiten

EPS = 1e-6


def test_grpo_group_normalisation() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    # group 1: mean 1/4, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    # group 2: mean 1/2, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3)
    s2 = 1 / math.sqrt(3)
    expected = (
        [0.75 / (0.5 + EPS)] + [-0.25 / (0.5 + EPS)] * 3 + [0.5 / (s2 + EPS)] * 2 + [-0.5 / (s2 + EPS)] * 2
    )
    assert torch.allclose(group_normalize(rewards, 4), torch.tensor(expected), atol=1e-6)
    # Dr. GRPO: no division by the std
    assert group_normalize(rewards, 4, normalize_std=False).tolist() == [
        0.75,
        -0.25,
        -0.25,
        -0.25,
        0.5,
        0.5,
        -0.5,
        -0.5,
    ]


def test_grpo_degenerate_groups() -> None:
    assert group_normalize(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2).tolist() == [0.0] * 4  # zero variance
    assert group_normalize(torch.tensor([1.0, 0.0]), 1).tolist() == [0.0, 0.0]  # no group, no advantage
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_normalize(torch.zeros(6), 4)


def test_grpo_broadcasts_to_response_tokens() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = grpo_advantages(torch.tensor([2.0, 0.0]), mask, 2, normalize_std=False)
    assert adv.tolist() == [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]


def test_token_rewards_put_reward_on_last_response_token() -> None:
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    kl = torch.full((3, 3), 0.1)
    got = token_rewards(torch.tensor([1.0, 0.0, 5.0]), mask, kl, kl_coef=0.5)
    expected = [[-0.05, -0.05, 0.95], [-0.05, -0.05, 0.0], [0.0, 0.0, 0.0]]  # -0.5 * 0.1 per token
    assert torch.allclose(got, torch.tensor(expected))


def test_discounted_returns() -> None:
    r = torch.tensor([[-0.05, -0.05, 0.95]])
    ones = torch.ones(1, 3)
    # gamma 0.5: G2 = 0.95, G1 = -0.05 + 0.475 = 0.425, G0 = -0.05 + 0.2125 = 0.1625
    assert torch.allclose(discounted_returns(r, ones, 0.5), torch.tensor([[0.1625, 0.425, 0.95]]))
    assert torch.allclose(discounted_returns(r, ones, 1.0), torch.tensor([[0.85, 0.9, 0.95]]))
    # a masked-out token (tool output) is skipped: G0 = 1 + 0.5 * 2
    gap = discounted_returns(torch.tensor([[1.0, 7.0, 2.0]]), torch.tensor([[1.0, 0.0, 1.0]]), 0.5)
    assert gap.tolist() == [[2.0, 0.0, 2.0]]


def test_reinforce_plus_plus_whitens_over_batch_tokens() -> None:
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = reinforce_plus_plus_advantages(torch.tensor([1.0, 0.0]), mask, torch.full((2, 3), 0.1), 0.5, 1.0)
    # returns: [0.85, 0.9, 0.95] and [-0.1, -0.05]; mean 0.51, population variance 1.147 / 5
    returns = [0.85, 0.9, 0.95, -0.1, -0.05]
    std = math.sqrt(sum((x - 0.51) ** 2 for x in returns) / 5 + 1e-8)
    expected = [[(x - 0.51) / std for x in returns[:3]], [(x - 0.51) / std for x in returns[3:]] + [0.0]]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-5)
    assert adv[mask.bool()].mean().abs() < 1e-6


def test_reinforce_plus_plus_baseline() -> None:
    # group means 0.5 and 1: baselined rewards [0.5, -0.5, 0, 0]; returns per token equal them;
    # mean 0, population variance 4 * 0.25 / 8 = 0.125
    adv = reinforce_plus_plus_baseline_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 2), 2)
    s = 0.5 / math.sqrt(0.125 + 1e-8)
    assert torch.allclose(adv, torch.tensor([[s, s], [-s, -s], [0.0, 0.0], [0.0, 0.0]]), atol=1e-5)


def test_gae_by_hand() -> None:
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # the 4th token is padding
    mask = torch.tensor([[1, 1, 1, 0]])
    r = token_rewards(torch.tensor([1.0]), mask, None, 0.0)
    adv, ret = gae(r, values, mask, gamma=0.9, lam=0.8)
    # delta2 = 1 - 0.7 = 0.3;              A2 = 0.3
    # delta1 = 0.9 * 0.7 - 0.6 = 0.03;     A1 = 0.03 + 0.72 * 0.3 = 0.246
    # delta0 = 0.9 * 0.6 - 0.5 = 0.04;     A0 = 0.04 + 0.72 * 0.246 = 0.21712
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0, 0.0]]), atol=1e-6)
    # gamma = lambda = 1: Monte Carlo, A_t = R - V_t and returns = R
    adv1, ret1 = gae(r, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv1, torch.tensor([[0.5, 0.4, 0.3, 0.0]]))
    assert torch.allclose(ret1, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))


def test_ppo_whitens_advantages_not_returns() -> None:
    values = torch.tensor([[0.5, 0.6, 0.7], [0.1, 0.2, 0.3]])
    mask = torch.ones(2, 3)
    adv, ret = ppo_advantages(torch.tensor([1.0, 0.0]), values, mask, gamma=0.9, lam=0.8)
    raw, raw_ret = gae(token_rewards(torch.tensor([1.0, 0.0]), mask, None, 0.0), values, mask, 0.9, 0.8)
    assert torch.allclose(adv, masked_whiten(raw, mask)) and torch.equal(ret, raw_ret)


@pytest.mark.parametrize(
    "estimator", ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
)
def test_compute_advantages_dispatch(estimator: str) -> None:
    # gamma and klCoef are refused with the group estimators, which do not read them
    shaped = {} if estimator in ("grpo", "gspo") else {"gamma": 0.9, "klCoef": 0.1}
    spec = AlgorithmSpec(advantageEstimator=estimator, **shaped)
    rewards, mask = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([[1, 1, 0]] * 4)
    out = compute_advantages(spec, rewards, mask, 2, kl=torch.zeros(4, 3), values=torch.zeros(4, 3))
    assert out.advantages.shape == (4, 3) and (out.advantages[:, 2] == 0).all()
    assert (out.returns is not None) == (estimator == "ppo")
    assert out.advantages[0, 0] > 0 > out.advantages[1, 0]


def test_ppo_needs_values() -> None:
    with pytest.raises(ValueError, match="critic's values"):
        compute_advantages(AlgorithmSpec(advantageEstimator="ppo"), torch.zeros(2), torch.ones(2, 1), 2)


def test_gae_skips_masked_out_tokens() -> None:
    # token 1 is a tool output (mask 0): no step, no value; token 3 is padding
    values = torch.tensor([[0.2, 5.0, 0.4, 7.0]])
    mask = torch.tensor([[1, 0, 1, 0]])
    r = token_rewards(torch.tensor([1.0]), mask, None, 0.0)  # reward on token 2
    adv, ret = gae(r, values, mask, gamma=0.5, lam=0.5)
    # delta2 = 1 - 0.4 = 0.6; A2 = 0.6
    # delta0 = 0.5 * 0.4 - 0.2 = 0.0; A0 = 0 + 0.25 * 0.6 = 0.15
    assert torch.allclose(adv, torch.tensor([[0.15, 0.0, 0.6, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.35, 0.0, 1.0, 0.0]]))


def test_explained_variance() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert masked_explained_variance(returns, returns, mask) == 1.0  # a perfect critic
    assert masked_explained_variance(torch.full_like(returns, 2.0), returns, mask) == 0.0  # the mean
    # a constant offset is no error in variance: errors = returns - 0 vary as the returns -> 0
    assert masked_explained_variance(torch.zeros(1, 4), returns, mask) == pytest.approx(0.0)
    # values [1, 2, 2]: errors [0, 0, 1], Var = 2/9; 1 - (2/9) / (2/3) = 2/3
    values = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    assert masked_explained_variance(values, returns, mask) == pytest.approx(2 / 3)
    assert masked_explained_variance(values, torch.ones(1, 4), mask) == 0.0  # returns do not vary
