"""Cross-field rules, written once and enforced twice.

Each rule carries a CEL expression, which `crdgen` puts into the CRD as an
`x-kubernetes-validations` entry so the API server refuses bad manifests, and an equivalent Python
predicate, which the models run so a config file outside Kubernetes gets the same verdict. The
message is one template rendered by both sides (CEL `messageExpression` and Python `str.format`),
so both say the same words. A unit test evaluates every CEL expression with a CEL interpreter
against the Python predicate on the same documents.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Rule:
    """A validation rule attached to one model class (CEL `self` is an instance of that class).

    `field` is the path reported to the user, relative to the object (".training.globalBatchSize").
    Transition rules (immutability) compare with `oldSelf` and take (old, new) in Python.
    """

    cel: str
    message: str
    field: str
    check: Callable[..., bool]
    values: Mapping[str, tuple[str, Callable[[Any], Any]]] = field(default_factory=dict)
    transition: bool = False
    reason: str = "FieldValueInvalid"

    def message_expression(self) -> str:
        """The message template as a CEL string expression over `self`."""
        parts: list[str] = []
        pos = 0
        for match in _PLACEHOLDER.finditer(self.message):
            if match.start() > pos:
                parts.append(_cel_string_literal(self.message[pos : match.start()]))
            parts.append(f"string({self.values[match.group(1)][0]})")
            pos = match.end()
        if pos < len(self.message):
            parts.append(_cel_string_literal(self.message[pos:]))
        return " + ".join(parts)

    def render(self, obj: Any) -> str:
        """The message for a failing object, as the API server would print it."""
        return self.message.format(**{k: _cel_str(fn(obj)) for k, (_, fn) in self.values.items()})

    def to_crd(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"rule": self.cel}
        if self.values:
            entry["messageExpression"] = self.message_expression()
        else:
            entry["message"] = self.message
        entry.update(fieldPath=self.field, reason=self.reason)
        return entry


def immutable(name: str, attr: str, *, optional: bool = False, hint: str) -> Rule:
    """A transition rule: field `name` (python attribute `attr`) may not change after creation."""
    if optional:
        cel = (
            f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == oldSelf.{name})"
        )
    else:
        cel = f"self.{name} == oldSelf.{name}"
    return Rule(
        cel=cel,
        message=f"{name} cannot be changed after the job is created: {hint}",
        field=f".{name}",
        check=lambda old, new: getattr(old, attr) == getattr(new, attr),
        transition=True,
    )


@dataclass(frozen=True)
class Violation:
    """A broken rule: where (dotted path from the spec) and what the API server would say."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _cel_string_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_str(value: Any) -> str:
    """Python's rendering of a value, matching CEL's string() for the types rules print."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_g(value)
    return str(value)


def go_g(x: float) -> str:
    """Go's fmt %g of a float64, which is what CEL's string(double) prints in the API server
    (cel-go: fmt.Sprintf("%g", d)): shortest digits, exponent form below 1e-4 or from 1e6 up."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign = "-" if x < 0 else ""
    mantissa, exponent = repr(abs(x)).partition("e")[::2]
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    # Decimal exponent of the first significant digit.
    point = len(whole) + (int(exponent) if exponent else 0)
    point -= len(whole + frac) - len(digits)
    digits = digits.rstrip("0")
    exp = point - 1
    if exp < -4 or exp >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp >= 0:
        int_part = digits[: exp + 1].ljust(exp + 1, "0")
        frac_part = digits[exp + 1 :]
    else:
        int_part, frac_part = "0", "0" * (-exp - 1) + digits
    return sign + int_part + ("." + frac_part if frac_part else "")
