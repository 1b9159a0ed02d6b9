"""Does the CPU demo config learn, per advantage estimator and seed? Prints each run's per-step
mean reward and the verdict of the shared learning criterion (tests/learning.py).

    .venv/bin/python benchmarks/learning_runs.py --estimator grpo gspo reinforce_plus_plus --seeds 1 2 3

Runs the real runtime (hf engine behind the sglang-router, torch trainer, local Ray) on
examples/manifests/grpo-cpu-demo.yaml without evaluation; about 4 minutes per run on 2 cores.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from bench_cli import add_json, doc_parser  # noqa: E402
from learning import demo_spec, learned  # noqa: E402

from rljob_api.resource import parse_spec  # noqa: E402


def run_one(estimator: str, seed: int, steps: int | None) -> dict[str, Any]:
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        spec = parse_spec(demo_spec(estimator, seed, Path(tmp) / "ckpt", steps))
        t0 = time.perf_counter()
        result = run(prepare(spec), RunOptions())
        seconds = time.perf_counter() - t0
    rewards = [h["reward/mean"] for h in result.history]
    ok, why = learned(rewards)
    return {"estimator": estimator, "seed": seed, "seconds": round(seconds), "learned": ok, "why": why}


def main() -> int:
    parser = doc_parser(__doc__, whole=True)
    parser.add_argument("--estimator", nargs="+", default=["grpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="override training.numRollout")
    add_json(parser, help="also write the results here")
    args = parser.parse_args()
    results = []
    for estimator in args.estimator:
        for seed in args.seeds:
            result = run_one(estimator, seed, args.steps)
            results.append(result)
            verdict = "learned" if result["learned"] else "DID NOT LEARN"
            print(
                f"{estimator:22} seed {seed}: {verdict} in {result['seconds']} s: {result['why']}", flush=True
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["learned"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
