"""The learning criterion shared by the learning proof (`make demo` in real pods, tests/realpods/test_job_in_real_pods.py)
and benchmarks/learning_runs.py: did the mean reward of a run clearly rise?

Criterion: the mean training reward of the last LAST steps (the second half of the demo's 10)
exceeds that of the first FIRST steps by at least MARGIN. The first window is short because the
demo learns fast: by step 3 a run is often half-way up already, and a longer first window would hide
the rise. The last window is half the run, so one bad late step (constant learning rate, 32 samples
a step: a run at 0.9 can dip to 0.5 for a step) does not fail a run that learned.

Why a pass is not luck: a demo step scores 8 prompts x 4 samples with rewards in {0, 1}. If the
32 rewards were independent, one step's mean would have a standard deviation of at most
0.5 / sqrt(32) = 0.088; the difference of a 5-step mean and a 2-step mean at most 0.074, so a run
that does not learn reaches MARGIN = 0.2 (2.7 standard deviations) with probability at most 0.4 %.
Samples of one prompt are correlated; in the worst case (a prompt's 4 samples always equal) the
bound is 0.148 and the probability 9 % per run. CI trains this config once, in the `make demo` e2e
test (seed 42): a run that does not learn fails it with probability at least 91 % even in that worst
case (99.6 % with independent samples). Until 2026-11-28 CI also trained seed 1 in an integration
test (tests/integration/test_learning.py: the same config without the operator, ~460 s of the
suite's ~1000 s), which took the worst case to 0.8 %; it was dropped to bring `make test` under 40
minutes. benchmarks/learning_runs.py reports the rise of every seed and estimator it runs
(docs/BENCHMARKS.md): runs that learn rise by 0.25 to 0.5.

History: the window was the last 3 steps until a CI run of seed 1 went 0.56 0.41 0.56 0.72 0.78
0.91 0.94 0.47 0.81 0.50 (learned, then dipped): +0.11 by the last 3, +0.24 by the last 5. Changed
after seeing that run; every run recorded in docs/BENCHMARKS.md passes both ways.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
FIRST = 2
LAST = 5
MARGIN = 0.2


def learned(
    rewards: Sequence[float], first: int = FIRST, last: int = LAST, margin: float = MARGIN
) -> tuple[bool, str]:
    """(verdict, explanation) for a run's per-step mean rewards, oldest first."""
    if len(rewards) < first + last:
        return False, f"{len(rewards)} steps: need at least {first + last}"
    start = sum(rewards[:first]) / first
    end = sum(rewards[-last:]) / last
    ok = end >= start + margin
    return ok, (
        f"mean reward of the first {first} steps {start:.3f}, of the last {last} {end:.3f} "
        f"(rise {end - start:+.3f}, needed {margin:+.3f}); per step: " + " ".join(f"{r:.2f}" for r in rewards)
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
