"""KL estimators against hand-computed values (x = logp - ref_logp)."""

from __future__ import annotations

import math

import pytest
import torch

from rljob_runtime.algo.kl import kl_estimate

X = [0.0, 1.0, -1.0, math.log(2.0)]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", X),
        ("k2", [0.0, 0.5, 0.5, 0.5 * math.log(2.0) ** 2]),
        # exp(-x) - 1 + x: e^-1 - 1 + 1; e - 1 - 1; 1/2 - 1 + ln 2
        ("k3", [0.0, math.exp(-1), math.e - 2, 0.5 - 1 + math.log(2.0)]),
        ("low_var_kl", [0.0, math.exp(-1), math.e - 2, 0.5 - 1 + math.log(2.0)]),
    ],
)
def test_estimators(kind: str, expected: list[float]) -> None:
    ref = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    logp = ref + torch.tensor(X)
    got = kl_estimate(logp, ref, kind)  # type: ignore[arg-type]
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)


def test_k3_nonnegative_and_low_var_clamped() -> None:
    x = torch.tensor([-30.0, -5.0, 0.3, 30.0])
    assert (kl_estimate(x, torch.zeros(4), "k3") >= 0).all()
    assert kl_estimate(x, torch.zeros(4), "k3")[0] == pytest.approx(math.exp(30) - 31, rel=1e-5)
    low = kl_estimate(x, torch.zeros(4), "low_var_kl")
    assert low.tolist()[0] == 10.0 and low.tolist()[3] == 10.0  # clamped to [-10, 10]
    assert low[2].item() == pytest.approx(math.exp(-0.3) - 1 + 0.3)


def test_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]
