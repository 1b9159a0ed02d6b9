"""Status as a pure function of (job, what the operator observed).

The phase is decided first; conditions follow from it so they can never contradict each other.
kstatus reads them: Ready is present from the first visit, Reconciling=True while starting,
Stalled=True when the job cannot make progress. `progress` belongs to the runtime and is not
produced here (the status patch never touches it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rljob_api.status import CONDITION_TYPES

from .checks import Blocker
from .job import Job
from .names import runtime_account_name
from .quota import Decision

TERMINAL = ("Succeeded", "Failed")

# Condition types that are True in each phase (all others are False).
_TRUE_IN_PHASE: dict[str, tuple[str, ...]] = {
    "Pending": ("Reconciling",),
    "Queued": ("Queued",),
    "Starting": ("Reconciling",),
    "Running": ("Ready",),
    "Succeeded": ("Ready", "Succeeded"),
    "Failed": ("Stalled", "Failed"),
    "Suspended": ("Ready", "Suspended"),
}


@dataclass(frozen=True)
class Observed:
    """What one reconcile pass saw."""

    now: datetime
    rayjob: Mapping[str, Any] | None = None
    blocker: Blocker | None = None
    queue: Decision | None = None
    pods: Blocker | None = None  # a job pod that cannot start (check_pods), read while Starting


@dataclass(frozen=True)
class Verdict:
    phase: str
    reason: str
    message: str
    stalled: bool = False  # Stalled=True although the phase is not Failed (e.g. a missing Secret)


def decide_phase(job: Job, seen: Observed) -> Verdict:
    """The phase, with a CamelCase reason and a message a person can act on."""
    previous = job.status.get("phase")
    rayjob = seen.rayjob
    if previous in TERMINAL and (rayjob is None or _rayjob_phase(job, rayjob) is None):
        # Finished jobs stay finished, even after their RayJob is cleaned up.
        return Verdict(
            previous,
            _condition(job, "Ready").get("reason", previous),
            _condition(job, "Ready").get("message", ""),
        )
    if seen.blocker is not None:
        if seen.blocker.terminal:
            return Verdict("Failed", seen.blocker.reason, seen.blocker.message)
        return Verdict("Pending", seen.blocker.reason, seen.blocker.message, stalled=True)
    if seen.queue is not None and not seen.queue.admitted:
        # Also a resumed job whose RayJob the quota keeps suspended: it waits, it is not starting.
        return Verdict("Queued", seen.queue.reason, seen.queue.message)
    if rayjob is None:
        if job.spec.suspend:
            return Verdict("Suspended", "Suspended", _SUSPENDED)
        return Verdict("Pending", "Creating", "creating the RayJob and the runtime's ServiceAccount")
    verdict = _rayjob_phase(job, rayjob) or Verdict(
        "Starting", "Starting", "the RayJob was created; waiting for KubeRay to start it"
    )
    if verdict.phase == "Starting" and seen.pods is not None:
        return Verdict("Starting", seen.pods.reason, seen.pods.message, stalled=True)
    return verdict


_SUSPENDED = (
    "suspended by spec.suspend: the Ray cluster is deleted and its GPUs are free. "
    "Set suspend to false to resume from the latest checkpoint."
)


def _rayjob_phase(job: Job, rayjob: Mapping[str, Any]) -> Verdict | None:
    status = rayjob.get("status") or {}
    deployment = status.get("jobDeploymentStatus", "")
    ray_status = status.get("jobStatus", "")
    reason = status.get("reason") or ""
    message = status.get("message") or ""
    if deployment == "Complete" and ray_status == "SUCCEEDED":
        return Verdict("Succeeded", "Completed", _completed(job))
    if deployment in ("Failed", "ValidationFailed") or (
        deployment == "Complete" and ray_status in ("FAILED", "STOPPED")
    ):
        detail = message or f"the Ray job ended {ray_status or deployment}"
        return Verdict("Failed", reason or "RayJobFailed", f"{detail} (RayJob {rayjob['metadata']['name']})")
    suspended = deployment in ("Suspending", "Suspended") or (rayjob.get("spec") or {}).get("suspend")
    if suspended:
        if job.spec.suspend:
            return Verdict("Suspended", "Suspended", _SUSPENDED)
        if job.spec.queue_name:
            return Verdict(
                "Queued",
                "WaitingForKueue",
                f"waiting for Kueue to admit the RayJob in LocalQueue {job.spec.queue_name!r}",
            )
        return Verdict("Starting", "Resuming", "resuming from the latest checkpoint on a new Ray cluster")
    if ray_status == "RUNNING":
        return Verdict("Running", "Running", _running(job))
    if deployment == "Retrying":
        return Verdict(
            "Starting", "Retrying", f"the Ray job failed and is retried on a new Ray cluster: {message}"
        )
    cluster = status.get("rayClusterStatus") or {}
    ready, desired = cluster.get("readyWorkerReplicas", 0), cluster.get("desiredWorkerReplicas", 0)
    pods = f": {ready}/{desired} worker pods ready" if desired else ""
    return Verdict("Starting", "Starting", f"Ray cluster starting{pods}")


def _running(job: Job) -> str:
    progress = job.status.get("progress") or {}
    if not progress.get("stepText"):
        return "training started; waiting for the first step"
    reward = progress.get("rewardMean")
    return f"step {progress['stepText']}" + (
        f", reward {reward:.3g}" if isinstance(reward, int | float) else ""
    )


def _completed(job: Job) -> str:
    progress = job.status.get("progress") or {}
    done = f"finished {progress.get('stepText') or job.spec.training.num_rollout} steps"
    checkpoint = progress.get("lastCheckpoint")
    return done + (f"; final checkpoint {checkpoint}" if checkpoint else "")


def _condition(job: Job, kind: str) -> dict[str, Any]:
    for condition in job.status.get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def conditions(job: Job, verdict: Verdict, now: datetime) -> list[dict[str, Any]]:
    """All condition types, each True/False, keeping lastTransitionTime when status did not change."""
    true_types = set(_TRUE_IN_PHASE[verdict.phase])
    if verdict.stalled:
        true_types.add("Stalled")
        true_types.discard("Reconciling")
    out = []
    for kind in CONDITION_TYPES:
        status = "True" if kind in true_types else "False"
        old = _condition(job, kind)
        changed = old.get("status") != status
        out.append(
            {
                "type": kind,
                "status": status,
                "observedGeneration": job.generation,
                "lastTransitionTime": old["lastTransitionTime"] if old and not changed else _time(now),
                "reason": verdict.reason,
                "message": verdict.message[:32768],
            }
        )
    return out


def compute_status(job: Job, seen: Observed) -> dict[str, Any]:
    """The operator-owned part of status (everything but progress)."""
    verdict = decide_phase(job, seen)
    status: dict[str, Any] = {
        "observedGeneration": job.generation,
        "phase": verdict.phase,
        "conditions": conditions(job, verdict, seen.now),
        "gpus": job.spec.total_gpus(),
    }
    if job.spec.queue_name:
        status["queue"] = job.spec.queue_name
    children: dict[str, Any] = {}
    if not job.spec.resources.service_account_name:
        children["serviceAccount"] = runtime_account_name(job.name)
    rayjob_status: Mapping[str, Any] = {}
    if seen.rayjob is not None:
        children["rayJob"] = seen.rayjob["metadata"]["name"]
        rayjob_status = seen.rayjob.get("status") or {}
        if rayjob_status.get("rayClusterName"):
            children["rayCluster"] = rayjob_status["rayClusterName"]
    elif (job.status.get("children") or {}).get("rayCluster"):
        children["rayCluster"] = job.status["children"]["rayCluster"]
    status["children"] = children
    if rayjob_status.get("failed"):
        status["restarts"] = int(rayjob_status["failed"])
    start = job.status.get("startTime") or rayjob_status.get("startTime")
    if start:
        status["startTime"] = start
    if verdict.phase in TERMINAL:
        status["completionTime"] = (
            job.status.get("completionTime") or rayjob_status.get("endTime") or _time(seen.now)
        )
    return status


def denied_status(job: Job, message: str, now: datetime) -> dict[str, Any]:
    """The job's operator-owned status with Stalled=True for a permission the operator lacks; the
    phase stays (the job itself is fine), and every other field is kept so the apply removes none."""
    phase = job.status.get("phase") or "Pending"
    kept = {key: value for key, value in job.status.items() if key != "progress"}
    verdict = Verdict(phase, "PermissionDenied", message, stalled=True)
    return {**kept, "phase": phase, "conditions": conditions(job, verdict, now)}


def announcement(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The event (type, reason, message) for a status change: every phase change ("A -> B: ..."),
    and a new reason within a phase (a blocker found, changed or cleared); None when neither."""
    ready = next(c for c in after["conditions"] if c["type"] == "Ready")
    old_ready = next((c for c in before.get("conditions") or [] if c.get("type") == "Ready"), {})
    stalled = any(c["type"] == "Stalled" and c["status"] == "True" for c in after["conditions"])
    kind = "Warning" if after["phase"] == "Failed" or stalled else "Normal"
    if before.get("phase") != after["phase"]:
        return (
            kind,
            ready["reason"],
            f"{before.get('phase') or 'New'} -> {after['phase']}: {ready['message']}",
        )
    if old_ready.get("reason") != ready["reason"]:
        return kind, ready["reason"], f"{after['phase']}: {ready['message']}"
    return None


def status_changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether patching /status would change anything the operator owns."""
    return any(current.get(key) != value for key, value in desired.items())


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
