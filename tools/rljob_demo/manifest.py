"""The demo's RLTrainingJob: the example manifest, adapted to run on this machine. Pure."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

NAMESPACE = "rljob-demo"
EXAMPLE = Path("examples/manifests/grpo-cpu-demo.yaml")


def demo_job(
    example: dict[str, Any],
    *,
    repo: Path,
    run_dir: Path,
    namespace: str = NAMESPACE,
    ttl_seconds: int | None = None,
) -> dict[str, Any]:
    """The example with what only this machine knows filled in.

    - data paths become absolute: the local Ray runs the job in its own working directory, not
      the repo (in a real cluster they would point into the image or a volume);
    - checkpoints (and the TensorBoard logs beside them) go to this run's directory, so a new run
      starts from step 0 instead of resuming the previous run's last checkpoint;
    - the namespace is the demo's, so `make demo-down` removes exactly what the demo created.
    """
    job = copy.deepcopy(example)
    job.setdefault("metadata", {})["namespace"] = namespace
    spec = job["spec"]
    data = spec["data"]
    data["path"] = _absolute(data["path"], repo)
    for dataset in (data.get("eval") or {}).get("datasets") or []:
        dataset["path"] = _absolute(dataset["path"], repo)
    spec.setdefault("checkpoint", {})["path"] = str(run_dir / "checkpoints")
    if ttl_seconds is not None:
        spec["ttlSecondsAfterFinished"] = ttl_seconds
    return job


def _absolute(path: str, repo: Path) -> str:
    return path if Path(path).is_absolute() else str((repo / path).resolve())


def tensorboard_dir(run_dir: Path) -> Path:
    """Where the runtime writes TensorBoard logs by default: <checkpoint.path>/tensorboard."""
    return run_dir / "checkpoints" / "tensorboard"
