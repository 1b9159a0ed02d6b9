"""What one pass of the reconciler does for a job, decided from the job and its RayJob as read (pure).

The reconciler (reconcile.py) reads, asks `plan`, carries the plan out and writes the status. The
plan names the stages a pass may take; the stages themselves still read what they need (the
pre-flight checks, the quota, Kueue), since only they know whether those reads are needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rljob_api.status import TERMINAL_PHASES

from .checks import Blocker, check_name
from .conversions import exporting
from .job import Job
from .restarts import Failure, failure_of, restart_pending, should_restart


@dataclass(frozen=True)
class Plan:
    """`rayjob`: the job's own RayJob (None when missing, or when the one of that name belongs to an
    earlier job of the same name: `leftover` names it, and it goes by garbage collection first).
    `blocker`: what stops the job before anything is created (its name). `restart`: the failure of
    the RayJob that a restart cures, within the backoff limit: record the restart and delete it (then
    plan again). `replacing`: a recorded restart's failed RayJob is still being deleted: nothing is
    applied to it, its successor is created once it is gone. A RayJob someone else deleted (KubeRay's
    finalizer holds it while it stops the Ray job) is not applied to either: an apply that lands
    after it is gone would create its successor unannounced. `apply`: run admission and create or
    update the children. `export`: run the checkpoint exports that are due."""

    rayjob: dict[str, Any] | None
    leftover: str | None = None
    blocker: Blocker | None = None
    restart: Failure | None = None
    replacing: bool = False
    apply: bool = False
    export: bool = False


def plan(job: Job, rayjob: dict[str, Any] | None) -> Plan:
    leftover = None
    if rayjob is not None and not job.owns(rayjob):
        leftover, rayjob = rayjob["metadata"]["name"], None
    blocker = check_name(job)
    finished = job.status.get("phase") in TERMINAL_PHASES
    # Training succeeded and the final export runs: nothing is restarted or created for training.
    training_over = finished or exporting(job.status)
    live = blocker is None and not training_over
    failure = failure_of(rayjob) if live and rayjob is not None else None
    restart = failure if failure is not None and should_restart(job, failure) else None
    replacing = rayjob is not None and restart_pending(job, rayjob)
    going = rayjob is not None and bool((rayjob.get("metadata") or {}).get("deletionTimestamp"))
    return Plan(
        rayjob=rayjob,
        leftover=leftover,
        blocker=blocker,
        restart=restart,
        replacing=replacing,
        apply=live and restart is None and not replacing and not going and leftover is None,
        export=blocker is None and leftover is None,
    )
