"""exact_match and SQuAD token F1."""

from __future__ import annotations

import pytest

from rljob_runtime.data.rewards.text_match import exact_match_reward, f1_reward, squad_normalize, token_f1


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        ("Paris", "Paris", 1.0),
        ("  Paris \n", "Paris", 1.0),
        ("New   York", "New York", 1.0),
        ("paris", "Paris", 0.0),  # case matters
        ("Paris.", "Paris", 0.0),
        ("Rome", ["Paris", "Rome"], 1.0),
        ("Paris", None, 0.0),
    ],
)
def test_exact_match(response: str, label: object, expected: float) -> None:
    assert exact_match_reward(response, label) == expected


def test_squad_normalize() -> None:
    assert squad_normalize("The  Eiffel Tower!") == "eiffel tower"


@pytest.mark.parametrize(
    ("pred", "truth", "expected"),
    [
        ("the eiffel tower", "Eiffel Tower", 1.0),
        ("eiffel", "eiffel tower", 2 * 1.0 * 0.5 / 1.5),  # P=1, R=1/2
        ("tower in paris", "eiffel tower", 2 * (1 / 3) * 0.5 / (1 / 3 + 0.5)),  # P=1/3, R=1/2
        ("x b b", "b b c", 2 / 3),  # duplicates count by multiplicity: common 2, P=R=2/3
        ("rome", "paris", 0.0),
        ("", "", 1.0),
        ("the", "paris", 0.0),  # an article only normalises to nothing
    ],
)
def test_token_f1(pred: str, truth: str, expected: float) -> None:
    assert token_f1(pred, truth) == pytest.approx(expected)


def test_f1_reward_takes_best_label() -> None:
    assert f1_reward("eiffel tower", ["louvre", "the Eiffel Tower"]) == 1.0
    assert f1_reward("x", None) == 0.0
