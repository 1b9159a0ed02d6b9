"""The GPU suite's verdict lines (tests/gpu/verdicts.py): one per test as it ends, on stdout and in
the results directory, so a GPU host call cut at its limit still says which tests passed."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import verdicts


def report(when: str, outcome: str, duration: float = 12.4, **kw: object) -> SimpleNamespace:
    return SimpleNamespace(
        when=when, outcome=outcome, duration=duration, nodeid="tests/gpu/test_x.py::test_y", **kw
    )


def test_a_call_gives_its_verdict_and_a_passed_setup_or_teardown_none() -> None:
    assert (
        verdicts.verdict_line(report("call", "passed")) == "VERDICT PASSED tests/gpu/test_x.py::test_y (12 s)"
    )
    assert verdicts.verdict_line(report("setup", "passed")) is None
    assert verdicts.verdict_line(report("teardown", "passed")) is None


def test_failures_and_skips_say_why_and_in_which_phase() -> None:
    failed = report("call", "failed", longreprtext="Traceback ...\nE   AssertionError: reward did not rise")
    assert verdicts.verdict_line(failed) == (
        "VERDICT FAILED tests/gpu/test_x.py::test_y (12 s): E   AssertionError: reward did not rise"
    )
    skipped = report("setup", "skipped", 0.0, longrepr=("conftest.py", 1, "Skipped: needs an NVIDIA GPU"))
    assert verdicts.verdict_line(skipped) == (
        "VERDICT SKIPPED tests/gpu/test_x.py::test_y (0 s, in setup): Skipped: needs an NVIDIA GPU"
    )
    torn = report("teardown", "failed", 3.0, longreprtext="Timeout >600.0s")
    assert (
        verdicts.verdict_line(torn)
        == "VERDICT FAILED tests/gpu/test_x.py::test_y (3 s, in teardown): Timeout >600.0s"
    )


def test_each_line_is_printed_at_once_and_appended_to_the_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLJOB_RESULTS_DIR", str(tmp_path / "res"))
    verdicts.record("VERDICT PASSED a (1 s)")
    verdicts.record("VERDICT FAILED b (2 s)")
    assert capsys.readouterr().out.strip().splitlines() == [
        "VERDICT PASSED a (1 s)",
        "",
        "VERDICT FAILED b (2 s)",
    ]
    lines = (tmp_path / "res" / verdicts.VERDICTS_FILE).read_text().splitlines()
    assert lines == ["VERDICT PASSED a (1 s)", "VERDICT FAILED b (2 s)"]
    monkeypatch.delenv("RLJOB_RESULTS_DIR")
    verdicts.record("VERDICT PASSED c (1 s)")  # no results directory: printed only
    assert len((tmp_path / "res" / verdicts.VERDICTS_FILE).read_text().splitlines()) == 2
