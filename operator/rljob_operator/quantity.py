"""Kubernetes resource quantities ("8", "1k", "500m") as whole numbers of units."""

from __future__ import annotations

import math

from kubernetes.utils import parse_quantity


def whole_units(quantity: str | int | None) -> int:
    """The quantity rounded down to whole units (GPUs come whole); 0 for a missing or malformed one,
    which the API server's validation makes rare (a hand-written status in a test, an old object)."""
    if quantity is None:
        return 0
    try:
        return math.floor(parse_quantity(quantity))
    except (TypeError, ValueError):
        return 0
