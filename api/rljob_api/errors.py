"""Turning pydantic's validation errors into the messages a person reads: one line per problem,
each naming the field by its YAML path (spec.rollout.batchSize) and saying what is wrong."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from .base import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    IMAGE_PATTERN,
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
)

# What a regular expression means, for people who would rather not read one.
_PATTERN_MEANING = {
    QUANTITY_PATTERN: "must be a non-negative Kubernetes quantity such as 4, 500m, 16Gi or 1e3",
    IMAGE_PATTERN: "must be an image reference: [registry[:port]/]lowercase/path[:tag][@digest]",
    LABEL_VALUE_PATTERN: "must be a label value: at most 63 letters, digits, '-', '_' or '.', beginning and "
    "ending with a letter or digit",
    DNS_LABEL_PATTERN: "must be a DNS label: lowercase letters, digits and '-', starting and ending "
    "with a letter or digit",
    DNS_SUBDOMAIN_PATTERN: "must be a DNS subdomain: lowercase letters, digits, '-' and '.'",
    QUALIFIED_NAME_PATTERN: "must be a qualified name: an optional DNS subdomain prefix and '/', then at "
    "most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit (e.g. "
    "'example.com/my-key' or 'zone')",
    ENV_NAME_PATTERN: "must be an environment variable name: letters, digits, '_', '-' and '.', "
    "not starting with a digit",
}


class SpecError(ValueError):
    """An RLTrainingJob (or its spec) that does not validate. `problems` are 'path: message' lines."""

    def __init__(self, problems: Sequence[str], *, source: str = "RLTrainingJob") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        lines = [f"{self.source} is invalid ({len(self.problems)} problem{'s' * (len(self.problems) != 1)}):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def problems_from(exc: ValidationError, model: type[BaseModel], prefix: str = "spec") -> list[str]:
    """One 'path: message' line per error in `exc` (raised by validating `model`)."""
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        path = _path(prefix, err["loc"])
        kind = err["type"]
        if kind == "rljob_rule":
            for field, message in err["ctx"]["violations"]:
                problems.append(f"{path}{field}: {message}")
        elif kind == "extra_forbidden":
            problems.append(f"{path}: unknown field{_suggestion(model, err['loc'])}")
        elif kind == "missing":
            problems.append(f"{path}: required field is missing")
        elif kind == "string_pattern_mismatch" and err["ctx"]["pattern"] in _PATTERN_MEANING:
            problems.append(
                f"{path}: {_PATTERN_MEANING[err['ctx']['pattern']]} (got {_show(err.get('input'))})"
            )
        else:
            problems.append(f"{path}: {_clean(err['msg'])} (got {_show(err.get('input'))})")
    return problems


def _path(prefix: str, loc: Sequence[Any]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before"):  # pydantic's validator wrappers
            continue
        else:
            path += f".{part}"
    return path


def _clean(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _suggestion(model: type[BaseModel], loc: Sequence[Any]) -> str:
    """', did you mean X?' for a misspelt field, using the aliases of the model that refused it."""
    owner: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        owner = _field_model(owner, str(part))
        if owner is None:
            return ""
    names = [info.alias or name for name, info in owner.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; known fields: {', '.join(names)}"


def _field_model(model: type[BaseModel], alias: str) -> type[BaseModel] | None:
    for name, info in model.model_fields.items():
        if alias in (name, info.alias):
            return _first_model(info.annotation)
    return None


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _first_model(arg)
        if found is not None:
            return found
    return None
