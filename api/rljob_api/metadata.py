"""The API server's rules for an object's name and namespace, in its words, so `rljob-runtime
validate` refuses what `kubectl apply` would (k8s.io/apimachinery's IsDNS1123Subdomain / Label)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .base import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN
from .resource import name_problems

SUBDOMAIN_MAX = 253
LABEL_MAX = 63
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com')"
)
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
)


def metadata_problems(metadata: Mapping[str, Any]) -> list[str]:
    """'metadata.<field>: <what is wrong>' for a manifest's name and namespace (empty when fine)."""
    problems = []
    name = metadata.get("name")
    if name is None and not metadata.get("generateName"):
        problems.append("metadata.name: Required value: name or generateName is required")
    elif name is not None:
        problems += _check("metadata.name", name, DNS_SUBDOMAIN_PATTERN, SUBDOMAIN_MAX, _SUBDOMAIN_MESSAGE)
        if isinstance(name, str) and len(name) <= SUBDOMAIN_MAX:
            # the CRD's own rules (NAME_VALIDATIONS), which the API server checks after these
            problems += [f"metadata.name: Invalid value: {name!r}: {p}" for p in name_problems(name)]
    namespace = metadata.get("namespace")
    if namespace is not None:
        problems += _check("metadata.namespace", namespace, DNS_LABEL_PATTERN, LABEL_MAX, _LABEL_MESSAGE)
    return problems


def _check(path: str, value: Any, pattern: str, most: int, meaning: str) -> list[str]:
    if not isinstance(value, str):
        return [f"{path}: Invalid value: {value!r}: must be a string"]
    problems = []
    if len(value) > most:
        problems.append(f"{path}: Invalid value: {value!r}: must be no more than {most} characters")
    if not re.fullmatch(pattern, value):
        problems.append(f"{path}: Invalid value: {value!r}: {meaning}")
    return problems
