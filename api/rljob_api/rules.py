"""Cross-field rules, written once and enforced twice.

Each rule carries a CEL expression, which `crdgen` puts into the CRD as an
`x-kubernetes-validations` entry so the API server refuses bad manifests, and an equivalent Python
predicate, which the models run so a config file outside Kubernetes gets the same verdict, with
the same static message. (Messages do not quote the offending numbers: a CEL `messageExpression`
with string(int) exceeds the API server's estimated cost budget, kubernetes/kubernetes#124234.)
A unit test evaluates every CEL expression with a CEL interpreter against the Python predicate on
the same documents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
    transition: bool = False
    reason: str = "FieldValueInvalid"

    def to_crd(self) -> dict[str, Any]:
        return {"rule": self.cel, "message": self.message, "fieldPath": self.field, "reason": self.reason}


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
