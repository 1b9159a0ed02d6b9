"""The learning criterion shared by the learning proof (tests/integration/test_learning.py), the
`make demo` e2e test and benchmarks/learning_runs.py: did the mean reward of a run clearly rise?

Criterion: the mean training reward of the last WINDOW steps exceeds that of the first WINDOW
steps by at least MARGIN. Why a pass is not luck: a step of the demo has 8 prompts x 4 samples with
rewards in {0, 1}. Even if the 4 samples of a prompt were always identical (8 independent draws),
one step's mean has a standard deviation of at most 0.5 / sqrt(8) = 0.18, a 3-step mean at most
0.10 and the difference of two such means at most 0.144: a run that does not learn passes with
probability at most P(Z >= 0.3 / 0.144 = 2.1) = 1.9 %, and the CI test needs two seeds to pass
(0.04 %). Runs that learn rise by about 0.6 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
WINDOW = 3
MARGIN = 0.3


def learned(rewards: Sequence[float], window: int = WINDOW, margin: float = MARGIN) -> tuple[bool, str]:
    """(verdict, explanation) for a run's per-step mean rewards, oldest first."""
    if len(rewards) < 2 * window:
        return False, f"{len(rewards)} steps: need at least {2 * window}"
    first = sum(rewards[:window]) / window
    last = sum(rewards[-window:]) / window
    ok = last >= first + margin
    return ok, (
        f"mean reward of the first {window} steps {first:.3f}, of the last {window} {last:.3f} "
        f"(rise {last - first:+.3f}, needed {margin:+.3f}); per step: "
        + " ".join(f"{r:.2f}" for r in rewards)
    )


def demo_spec(estimator: str, seed: int, ckpt: Path, steps: int | None = None) -> dict[str, Any]:
    """The CPU demo's spec (examples/manifests/grpo-cpu-demo.yaml) for a learning run: absolute
    data path, no evaluation (the criterion reads training rewards), the given estimator and seed."""
    doc = yaml.safe_load((REPO / "examples/manifests/grpo-cpu-demo.yaml").read_text())
    spec = copy.deepcopy(doc["spec"])
    spec["data"]["path"] = str(REPO / spec["data"]["path"])
    spec["data"].pop("eval", None)
    spec["algorithm"]["advantageEstimator"] = estimator
    spec["training"]["seed"] = seed
    if steps:
        spec["training"]["numRollout"] = steps
    spec["checkpoint"] = {"path": str(ckpt), "saveInterval": 0}
    return spec
