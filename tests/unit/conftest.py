"""Fixtures shared by unit test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from megatron_cpu import cpu_megatron_world


@pytest.fixture(scope="module")
def cpu_megatron() -> Iterator[None]:
    """A one-rank megatron-core world on CPU (tests/megatron_cpu.py) for the module's tests."""
    with cpu_megatron_world():
        yield
