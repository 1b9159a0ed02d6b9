"""Kubernetes resource quantities ("8", "1k", "500m", "1Gi", "1e3") as numbers.

Our own parser, so the operator does not install the synchronous `kubernetes` client for its
`parse_quantity` alone: kopf imports that client whenever it is installed (25 MiB of the operator's
memory). It returns what `kubernetes.utils.parse_quantity` returns for every quantity the API server
accepts (tests/unit/test_operator_quantity.py compares the two), and refuses what is not one
(NaN, Infinity, spaces, underscores, a suffix after an exponent), which Python's Decimal would take.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException

# apimachinery's grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go): a signed decimal number,
# then a binary suffix (Ki..Ei), a decimal exponent (e or E and a signed integer) or a decimal
# suffix (n, u, m, none, k, M, G, T, P, E). "1E" is exa; "1E3" is an exponent.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE])i|(?P<exponent>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE])?)"
)
_POWERS = {"n": -3, "u": -2, "m": -1, "k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


def parse_quantity(quantity: str | int | float | Decimal) -> Decimal:
    """The quantity's value; ValueError when it is not a Kubernetes quantity."""
    if isinstance(quantity, int | float | Decimal):
        return Decimal(quantity)
    found = _QUANTITY.fullmatch(quantity) if isinstance(quantity, str) else None
    if found is None:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    binary, exponent, decimal = found.group("binary", "exponent", "decimal")
    try:
        if exponent:
            return Decimal(found.group("number") + exponent)  # past Decimal's exponent range: refused
        number = Decimal(found.group("number"))
        if not binary and not decimal:
            return number
        # The same arithmetic as kubernetes.utils (Decimal powers, the context's 28 digits), so the
        # results are equal to the last digit.
        base = 1024 if binary else 1000
        return number * (base ** Decimal(_POWERS[binary or decimal]))
    except DecimalException as exc:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}") from exc


def whole_units(quantity: str | int | None) -> int:
    """The quantity rounded down to whole units (GPUs come whole); 0 for a missing or malformed one,
    which the API server's validation makes rare (a hand-written status in a test, an old object)."""
    if quantity is None:
        return 0
    try:
        return math.floor(parse_quantity(quantity))
    except (TypeError, ValueError, OverflowError):
        return 0
