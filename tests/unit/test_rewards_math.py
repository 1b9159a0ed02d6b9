"""Rule-based math rewards (math, dapo, deepscaler): table-driven, with tricky answers."""

from __future__ import annotations

import pytest

from rljob_runtime.data.rewards.dapo import dapo_extract, dapo_reward, normalize_final_answer
from rljob_runtime.data.rewards.deepscaler import deepscaler_reward
from rljob_runtime.data.rewards.math_answer import (
    answers_equal,
    extract_answer,
    last_boxed,
    last_number,
    math_reward,
    normalize,
    to_number,
)

# (response, label, expected reward)
MATH_CASES = [
    (r"So the answer is \boxed{42}.", "42", 1.0),
    (r"\boxed{41}", "42", 0.0),
    (r"First \boxed{3}, no wait, \boxed{4}", "4", 1.0),  # the last box wins
    (r"First \boxed{3}, no wait, \boxed{4}", "3", 0.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\dfrac{1}{2}}", "1/2", 1.0),
    (r"\boxed{\frac12}", "0.5", 1.0),
    (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\frac{\frac{1}{2}}{3}}", "1/6", 1.0),  # nested braces
    (r"\boxed{\frac{3}{4}}", "0.75", 1.0),
    (r"\boxed{\frac{2}{3}}", "0.67", 0.0),  # not within tolerance
    ("The total is 1,000 apples.", "1000", 1.0),
    (r"\boxed{1,234,567}", "1234567", 1.0),
    (r"\boxed{\$5}", "5", 1.0),
    ("It costs $5.", "5", 1.0),
    ("She pays 12 dollars.", "12", 1.0),
    (r"\boxed{50\%}", "50", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{90^{\circ}}", "90 degrees", 1.0),
    (r"\boxed{\text{5 cm}}", "5", 1.0),
    (r"\boxed{\text{(B)}}", "(B)", 1.0),
    ("The answer is 7.", "7", 1.0),  # trailing period
    ("x = -3", "-3", 1.0),  # negative number
    ("The temperature dropped to -12", "-12", 1.0),
    ("from 3-5 apples we get 5", "5", 1.0),
    (r"\boxed{3.0}", "3", 1.0),  # integer vs 3.0
    (r"\boxed{3}", "3.00", 1.0),
    ("no numbers here", "3", 0.0),
    (r"\boxed{x = 4}", "4", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt2", 1.0),
    (r"\boxed{2\sqrt{2}}", r"2\sqrt{2}", 1.0),
    (r"\boxed{\left(1, 2\right)}", "(1,2)", 1.0),
    (r"\boxed{ 10 }", "10", 1.0),
    (r"\boxed{-\frac{1}{4}}", "-0.25", 1.0),
    ("ratio .5", "0.5", 1.0),
    (r"\boxed{3\times10^2}", "300", 1.0),
    (r"\boxed{12}", "1,2", 0.0),  # a list is not a thousands separator
    ("answer: 42", 42, 1.0),  # numeric labels
    (r"\boxed{\pi}", r"\pi", 1.0),
    (r"\boxed{\pi}", "3.14159", 0.0),  # symbols are compared as strings only
]


@pytest.mark.parametrize(("response", "label", "expected"), MATH_CASES)
def test_math_reward(response: str, label: object, expected: float) -> None:
    assert math_reward(response, label) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{a{b}c}", "a{b}c"),
        (r"\boxed{\frac{1}{2}} and \boxed{x^{2}}", "x^{2}"),
        (r"\boxed 5", "5"),
        (r"\boxed{unclosed", None),
        ("nothing", None),
        (r"\fbox{7}", "7"),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a 1,000 b", "1,000"), ("-2.5 then 3/4", "3/4"), ("x-5", "5"), ("v2 is 10", "10"), ("none", None)],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


def test_extract_prefers_boxed_over_last_number() -> None:
    assert extract_answer(r"\boxed{8} because 2 * 4 = 8 and 9") == "8"


def test_normalize_and_to_number() -> None:
    assert normalize(r"\text{\$1,000.}") == "1000"
    assert to_number("1/2") == 0.5
    assert to_number("2**100") is None  # exponent bound: no huge numbers
    assert to_number("import os") is None
    assert not answers_equal(None, "1")
    assert not answers_equal("", "")


DAPO_CASES = [
    ("Reasoning...\nAnswer: 42", "42", 1.0),
    ("Reasoning...\nanswer: 42", "42", 1.0),  # case-insensitive as in DAPO
    ("Reasoning...\nAnswer: 41", "42", -1.0),
    ("Answer: 1\nmore\nAnswer: 2", "2", 1.0),  # the last one
    ("no final answer", "42", -1.0),
    (r"Answer: $\frac{1}{2}$", r"\frac{1}{2}", 1.0),
    (r"Answer: \frac12", r"\frac{1}{2}", 1.0),
    ("Answer: 1,000", "1000", 1.0),
    ("Answer: 5 dollars", "5", 1.0),
    ("Answer: x = 7", "7", 1.0),
    ("Answer: 0.5", "1/2", -1.0),  # DAPO is strictly string-based
    ("Answer: 42" + "x" * 400, "42", -1.0),  # only the last 300 characters are read
]


@pytest.mark.parametrize(("response", "label", "expected"), DAPO_CASES)
def test_dapo_reward(response: str, label: str, expected: float) -> None:
    assert dapo_reward(response, label) == expected


def test_dapo_helpers() -> None:
    assert dapo_extract("foo\nAnswer:  17 ") == "17 "
    assert normalize_final_answer(r"\boxed{10}") == "10"
    assert normalize_final_answer(r"\text{east}") == "east"


DEEPSCALER_CASES = [
    (r"<think>hmm</think> so \boxed{12}", "12", 1.0),
    (r"<think>hmm \boxed{12} never closed", "12", 0.0),
    (r"no think \boxed{0.5}", r"\frac{1}{2}", 1.0),
    ("<think>x</think> the answer is 12", "12", 0.0),  # boxed required
    (r"<think>\boxed{12}</think> \boxed{13}", "12", 0.0),  # only after the reasoning
    (r"\boxed{3}", ["2", "3"], 1.0),  # any of several labels
    (r"\boxed{3}", "", 0.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), DEEPSCALER_CASES)
def test_deepscaler_reward(response: str, label: object, expected: float) -> None:
    assert deepscaler_reward(response, label) == expected
