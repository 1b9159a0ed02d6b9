"""The demo's run directories (<state dir>/runs/<YYYYmmdd-HHMMSS>): listing, sizes, pruning.

Each run keeps its job.yaml, reward.png and checkpoints (about 1.6 GB for SmolLM2-135M with Adam),
so runs are pruned to the newest few when a new one starts: a machine that runs `make demo` every
day (CI does) must not fill its disk.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

KEEP_RUNS = 2  # the new run and the one before it
_RUN_NAME = re.compile(r"^\d{8}-\d{6}$")


def list_runs(runs_dir: Path) -> list[Path]:
    """The run directories, oldest first (their names are timestamps). Other entries are left alone."""
    if not runs_dir.is_dir():
        return []
    return sorted(p for p in runs_dir.iterdir() if p.is_dir() and _RUN_NAME.match(p.name))


def size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def human(n_bytes: int) -> str:
    if n_bytes < 1000:
        return f"{n_bytes} B"
    value = float(n_bytes)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def prune(runs_dir: Path, keep: int) -> tuple[list[Path], int]:
    """Remove all but the newest ``keep`` runs. Returns (removed, bytes freed)."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    runs = list_runs(runs_dir)
    doomed = runs[: max(len(runs) - keep, 0)]
    freed = 0
    for run in doomed:
        freed += size_bytes(run)
        shutil.rmtree(run)
    return doomed, freed
