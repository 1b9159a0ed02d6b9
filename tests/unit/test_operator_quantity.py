"""The operator's quantity parser (quantity.py) against the one it replaces,
`kubernetes.utils.parse_quantity`: the same Decimal for every Kubernetes quantity, an error for
whatever that one refuses, and an error for the few non-quantities Python's Decimal lets through."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from decimal import Decimal

import pytest

from rljob_operator.quantity import _QUANTITY, parse_quantity, whole_units

kubernetes_utils = pytest.importorskip(
    "kubernetes.utils", reason="the synchronous client: pip install -e '.[dev]'"
)
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

theirs = kubernetes_utils.parse_quantity


def outcome(parse: Callable[[str], Decimal], quantity: str) -> Decimal | str:
    try:
        return parse(quantity)
    except ValueError:
        return "refused"


NUMBERS = (
    "0",
    "1",
    "8",
    "+3",
    "-2",
    "1.5",
    ".5",
    "5.",
    "0.001",
    "007",
    "-0.25",
    "123456789012345678901234567890",
)
SUFFIXES = ("", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
EXPONENTS = ("e3", "E3", "e-2", "E+4", "e0", "e27", "E-30")
# Accepted by kubernetes.utils through Decimal, never by the API server: refused here.
NOT_QUANTITIES = (
    "NaN",
    "Infinity",
    "-inf",
    " 1",
    "1 ",
    "1_000",
    "1e3k",  # an exponent and a suffix
    "1e3Ki",
    "1K",  # the decimal kilo is a lowercase k
)
# Refused by both.
MALFORMED = (
    "",
    "k",
    "Ki",
    "1ki",
    "1mi",
    "1ni",
    "1ui",
    "1Qi",
    "1x",
    "1e",
    "e3",
    "1.2.3",
    "--1",
    "1Kii",
    "0x10",
    "1.5e2.5",
)


@pytest.mark.parametrize("quantity", ["".join(p) for p in itertools.product(NUMBERS, SUFFIXES + EXPONENTS)])
def test_every_quantity_has_the_same_value(quantity: str) -> None:
    ours = parse_quantity(quantity)
    assert isinstance(ours, Decimal)
    assert ours == theirs(quantity)


@pytest.mark.parametrize("quantity", MALFORMED)
def test_what_kubernetes_refuses_is_refused(quantity: str) -> None:
    with pytest.raises(ValueError):
        theirs(quantity)
    with pytest.raises(ValueError):
        parse_quantity(quantity)


@pytest.mark.parametrize("quantity", NOT_QUANTITIES)
def test_what_is_not_a_quantity_is_refused_though_decimal_takes_it(quantity: str) -> None:
    theirs(quantity)  # no error there
    with pytest.raises(ValueError):
        parse_quantity(quantity)


@pytest.mark.parametrize("number", [0, 8, -3, 2.5, Decimal("1.25")])
def test_numbers_are_taken_as_they_are(number: int | float | Decimal) -> None:
    assert parse_quantity(number) == theirs(number)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(_QUANTITY, fullmatch=True))
def test_the_grammar_agrees_with_kubernetes(quantity: str) -> None:
    """Values, and the refusals of exponents past Decimal's range ("0E1000000000000000000")."""
    assert outcome(parse_quantity, quantity) == outcome(theirs, quantity)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.+-eEiKMGTPnumk ", max_size=8))
def test_nothing_is_taken_that_kubernetes_refuses(text: str) -> None:
    try:
        ours = parse_quantity(text)
    except ValueError:
        return
    assert ours == theirs(text)


@pytest.mark.parametrize(
    ("quantity", "units"),
    [("8", 8), ("1500m", 1), ("2k", 2000), ("1Ki", 1024), ("1e2", 100), ("-1", -1), (None, 0), (4, 4)]
    + [(bad, 0) for bad in ("", "NaN", "Infinity", "1x")],
)
def test_whole_units(quantity: str | int | None, units: int) -> None:
    assert whole_units(quantity) == units
