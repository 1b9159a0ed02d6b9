"""Each GPU test's verdict as it ends, not only at the end of the session.

A GPU host call may be cut at its time limit; pytest's -q prints dots and its summary only at the
end, so a cut run said nothing about the tests that had finished. ``verdict_line`` turns one phase
report into a line (None for the reports that decide nothing); the conftest prints it at once and
appends it to ``$RLJOB_RESULTS_DIR/verdicts.txt`` when that is set (benchmarks/gpu/host/run.sh sets it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

VERDICTS_FILE = "verdicts.txt"


def verdict_line(report: Any) -> str | None:
    """``VERDICT PASSED tests/gpu/x.py::t (12 s)`` for a test's call; a failed or skipped setup and a
    failed teardown get a line too (their phase named); None otherwise."""
    when, outcome = report.when, report.outcome
    decisive = (
        when == "call"
        or (when == "setup" and outcome != "passed")
        or (when == "teardown" and outcome == "failed")
    )
    if not decisive:
        return None
    phase = "" if when == "call" else f", in {when}"
    reason = ""
    if outcome == "skipped" and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        reason = f": {report.longrepr[2]}"
    elif outcome == "failed":
        text = str(getattr(report, "longreprtext", "") or "").strip().splitlines()
        reason = f": {text[-1][:300]}" if text else ""
    return f"VERDICT {outcome.upper()} {report.nodeid} ({report.duration:.0f} s{phase}){reason}"


def record(line: str, results_dir: str | None = None) -> None:
    """Print ``line`` now and append it to the results directory's verdicts file, if there is one."""
    print(f"\n{line}", flush=True)
    folder = results_dir if results_dir is not None else os.environ.get("RLJOB_RESULTS_DIR")
    if folder:
        path = Path(folder) / VERDICTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(line + "\n")
