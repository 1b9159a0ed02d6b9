"""tools/import_cycles.py: a cycle between modules fails lint, also through an import under
TYPE_CHECKING or inside a function; a one-way staircase passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import import_cycles


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / name / f"{module}.py").write_text(text)


def test_cycles_are_the_strongly_connected_parts_in_a_stable_order() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}, "g": set()}
    assert import_cycles.cycles(edges) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert import_cycles.describe(["a", "b", "c"], edges) == "a -> b -> c -> a"


def test_a_staircase_has_no_cycle() -> None:
    edges = {f"m{i}": {f"m{j}" for j in range(i)} for i in range(200)}  # deep: no recursion limit
    assert import_cycles.cycles(edges) == []


@pytest.mark.parametrize(
    "back",
    [
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .top import Top\n",
        "def late():\n    from . import top\n    return top\n",
    ],
    ids=["type-only", "late-import"],
)
def test_a_hidden_import_back_up_is_a_cycle(
    back: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _package(tmp_path, "cyclepkg", {"top": "from . import low\nclass Top: ...\n", "low": back})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles.main(["cyclepkg"]) == 1
    out = capsys.readouterr().out
    assert "import cycle (2 modules): cyclepkg.low -> cyclepkg.top -> cyclepkg.low" in out


def test_one_way_imports_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(tmp_path, "stairpkg", {"top": "from . import low\n", "low": "import json\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles.main(["stairpkg"]) == 0
