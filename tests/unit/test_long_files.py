"""tools/long_files.py: a product module over the limit needs a reason near its top."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import long_files


def _module(lines: int, head: str = "") -> str:
    return head + "\n".join(f"x{i} = {i}" for i in range(lines - head.count("\n"))) + "\n"


def test_a_long_module_without_a_reason_is_named_with_its_length() -> None:
    found = long_files.problem(Path("runtime/x.py"), _module(long_files.LIMIT + 1))
    assert found is not None and found.startswith(f"runtime/x.py: {long_files.LIMIT + 1} lines")


def test_a_reason_near_the_top_lets_it_pass_and_an_empty_or_late_one_does_not() -> None:
    reason = "# long-file: one protocol, each endpoint beside its codec\n"
    assert long_files.problem(Path("x.py"), _module(long_files.LIMIT + 50, reason)) is None
    assert long_files.problem(Path("x.py"), _module(long_files.LIMIT + 50, "# long-file:\n")) is not None
    late = "\n" * long_files.REASON_WITHIN + reason
    assert long_files.problem(Path("x.py"), _module(long_files.LIMIT + 50, late)) is not None
    assert long_files.problem(Path("x.py"), _module(long_files.LIMIT)) is None


def test_every_product_module_passes() -> None:
    assert long_files.main([]) == 0
