"""Where the demo's job comes from and where its outputs land. Pure."""

from __future__ import annotations

from pathlib import Path

NAMESPACE = "rljob-demo"
EXAMPLE = Path("examples/manifests/grpo-cpu-demo.yaml")


def tensorboard_dir(run_dir: Path) -> Path:
    """Where the runtime writes TensorBoard logs by default: <checkpoint.path>/tensorboard, which is
    the run directory's `checkpoints` on this machine (inpods.job_in_pods)."""
    return run_dir / "checkpoints" / "tensorboard"
