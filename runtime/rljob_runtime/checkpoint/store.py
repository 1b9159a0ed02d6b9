"""Where checkpoints live and which one is the latest.

Layout: <checkpoint.path>/iter_<step:07d>/ holding the trainer's files (model/ as a Hugging Face
directory, one trainer_rank<r>.pt per rank) and driver.json (step, data-source position, driver
RNG, partial-rollout buffer). The file `complete` is written last, so a crash mid-save leaves a
directory that resume ignores.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

_ITER = re.compile(r"^iter_(\d{7})$")
COMPLETE = "complete"
DRIVER_STATE = "driver.json"
MODEL_DIR = "model"  # the policy as a Hugging Face directory (what engines of a resumed run load)


def model_dir(directory: str | Path) -> Path:
    """The HF export inside one iteration's directory."""
    return Path(directory) / MODEL_DIR


def iteration_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def completed_steps(root: str | Path) -> list[int]:
    """Steps with a complete checkpoint under `root`, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _ITER.match(child.name)
        if match and (child / COMPLETE).exists():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest(root: str | Path) -> tuple[int, Path] | None:
    steps = completed_steps(root)
    return (steps[-1], iteration_dir(root, steps[-1])) if steps else None


def write_driver_state(directory: Path, state: dict[str, Any]) -> None:
    (directory / DRIVER_STATE).write_text(json.dumps(state, indent=1, sort_keys=True))


def read_driver_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / DRIVER_STATE).read_text())


def mark_complete(directory: Path) -> None:
    (directory / COMPLETE).write_text("")


def prune(root: str | Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` complete checkpoints (0 keeps all); returns the deleted steps."""
    steps = completed_steps(root)
    doomed = steps[:-keep] if keep and len(steps) > keep else []
    for step in doomed:
        shutil.rmtree(iteration_dir(root, step), ignore_errors=True)
    return doomed
