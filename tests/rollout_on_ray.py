"""A RolloutManager on a fresh local Ray for integration tests: started for a spec, its engine logs
printed when setup or a test fails, everything stopped afterwards."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from rljob_runtime import placement as placement_mod
from rljob_runtime.rollout.generate import RetryPolicy
from rljob_runtime.rollout.manager import RolloutManager


@contextlib.contextmanager
def rollout_on_ray(
    spec: Any, model: Path, log_dir: Path, *, retry: RetryPolicy, engines: int | None = None
) -> Iterator[RolloutManager]:
    ray.init(
        num_cpus=2,
        resources=placement_mod.local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}},  # engines do not spin on 2 cores
    )
    manager = None
    try:
        placement = placement_mod.create_placement(spec, timeout_s=60)
        if engines is not None:
            assert placement.colocated and len(placement.engine_slots()) == engines
        manager = RolloutManager.create(spec, model, placement, retry=retry, log_dir=log_dir)
        yield manager
    except BaseException:
        for log in sorted(log_dir.rglob("*.log")):
            sys.stderr.write(f"---- {log}\n{log.read_text(errors='replace')[-3000:]}\n")
        raise
    finally:
        if manager is not None:
            manager.shutdown()
        ray.shutdown()
