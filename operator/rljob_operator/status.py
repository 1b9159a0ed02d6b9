"""Status as a pure function of (job, what the operator observed).

The phase is decided first; conditions follow from it so they can never contradict each other.
kstatus reads them: Ready is present from the first visit, Reconciling=True while starting,
Stalled=True when the job cannot make progress. Ready carries the summary (its message is the
`-o wide` column); every other condition carries a reason of its own. `progress` belongs to the
runtime and is not produced here (the status patch never touches it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rljob_api.contract import RLJOB_CACHE
from rljob_api.status import CONDITION_TYPES, TERMINAL_PHASES

from .checks import Blocker
from .conversions import (
    CONVERSION_FAILED,
    CONVERTING,
    EXPORT_FAILED,
    EXPORTING,
    FAILED,
    SUCCEEDED,
    Wanted,
    conversion_entries,
    entry_of,
    exporting,
    failed_message,
    final_export,
    megatron_conversion,
    needs_megatron_checkpoint,
)
from .job import Job
from .kueue import WAITING_FOR_KUEUE, held_by_kueue, local_queue, waiting_message
from .names import runtime_account_name
from .pod_states import NODE_NOT_READY, Stuck
from .pod_states import REASONS as STUCK_REASONS
from .quota import Decision
from .restarts import (
    EXHAUSTED,
    RESTARTING,
    Failure,
    exhausted_message,
    failure_of,
    history,
    last_line,
    restart_entry,
    restart_pending,
    restarting_message,
    restarts,
    should_restart,
    with_restart,
)

TERMINAL = TERMINAL_PHASES
RETRYING = "Retrying"  # Reconciling's reason while API calls fail and are retried

# Condition types that are True in each phase (all others are False).
_TRUE_IN_PHASE: dict[str, tuple[str, ...]] = {
    "Pending": ("Reconciling",),
    "Queued": ("Queued",),
    "Converting": ("Reconciling",),
    "Starting": ("Reconciling",),
    "Running": ("Ready",),
    "Succeeded": ("Ready", "Succeeded"),
    "Failed": ("Stalled", "Failed"),
    "Suspended": ("Ready", "Suspended"),
}
# (reason, message) of a condition that is False, where that says more than the phase's reason.
_FALSE: dict[str, tuple[str, str]] = {
    "Stalled": ("NotStalled", "nothing blocks the job"),
    "Queued": ("NotQueued", "not waiting for GPU quota or a Kueue queue"),
    "Succeeded": ("NotFinished", "the job has not finished"),
    "Failed": ("NotFailed", "the job has not failed"),
    "Suspended": ("NotSuspended", "spec.suspend is false"),
}


@dataclass(frozen=True)
class Observed:
    """What one reconcile pass saw."""

    now: datetime
    rayjob: Mapping[str, Any] | None = None
    blocker: Blocker | None = None
    queue: Decision | None = None
    pods: Stuck | None = None  # why the Ray cluster does not start (pod_states.classify), while Starting
    # The RayJob of an earlier job of this name (deleted, created again), not deleted yet: the
    # operator waits for garbage collection before it creates this job's own.
    leftover: str | None = None
    # Conversions the job needs now, and the RayJobs of those this pass looked up (None: not there).
    wanted: tuple[Wanted, ...] = ()
    conversions: Mapping[str, Mapping[str, Any] | None] = dataclasses.field(default_factory=dict)
    nodes: Stuck | None = None  # a running job's pods on nodes that are not Ready (pod_states.node_trouble)


@dataclass(frozen=True)
class Verdict:
    phase: str
    reason: str
    message: str  # one line a person reads in `kubectl get -o wide`
    stalled: bool = False  # Stalled=True although the phase is not Failed (e.g. a missing Secret)
    detail: str = ""  # the whole story for the Failed / Stalled condition (KubeRay's message), if longer
    # Running, but not well: Ready=False and Reconciling=True (a node not Ready: the cluster may yet
    # bring it back, so it is not Stalled), so kstatus reads the job as in progress, not current.
    degraded: bool = False


def decide_phase(job: Job, seen: Observed, conversions: list[dict[str, Any]] | None = None) -> Verdict:
    """The phase, with a CamelCase reason and a message a person can act on. `conversions`:
    status.conversions as this pass leaves it."""
    conversions = conversions or []
    previous = job.status.get("phase")
    rayjob = seen.rayjob
    if previous in TERMINAL:
        # Finished jobs stay finished, even after their RayJob is cleaned up (or suspended).
        ready, outcome = _condition(job, "Ready"), _condition(job, previous)
        message = ready.get("message", "")
        detail = outcome.get("message", "") if outcome.get("status") == "True" else ""
        return Verdict(previous, ready.get("reason", previous), message, detail=detail)
    if seen.blocker is not None:
        if seen.blocker.terminal:
            return Verdict("Failed", seen.blocker.reason, seen.blocker.message)
        return Verdict("Pending", seen.blocker.reason, seen.blocker.message, stalled=True)
    if seen.queue is not None and not seen.queue.admitted:
        if seen.queue.impossible:  # never fits: it does not hold the queue either
            return Verdict("Pending", seen.queue.reason, seen.queue.message, stalled=True)
        # Also a resumed job whose RayJob the quota keeps suspended: it waits, it is not starting.
        resuming = "resuming once admitted: " if rayjob is not None else ""
        return Verdict("Queued", seen.queue.reason, resuming + seen.queue.message)
    if rayjob is None and job.spec.suspend:
        return Verdict("Suspended", "Suspended", _SUSPENDED)
    if restart_pending(job, rayjob):  # the failed RayJob is going or gone, the new one not there yet
        return _restarting(job, history(job.status)[-1])
    if rayjob is None and exporting(job.status):  # the training RayJob went (ttl) during the export
        return _after_training(job, Verdict("Succeeded", "Completed", _completed(job)), conversions)
    if rayjob is None and needs_megatron_checkpoint(job):
        converting = _converting(job, conversions)
        if converting is not None and seen.pods is not None and not converting.stalled:
            stuck = stuck_verdict(job, seen.pods, seen.now)  # the conversion's pod does not run
            return dataclasses.replace(stuck, phase="Failed" if stuck.phase == "Failed" else "Converting")
        if converting is not None:
            return converting
    if rayjob is None and seen.leftover:
        return Verdict(
            "Pending",
            "Creating",
            f"waiting for RayJob {seen.leftover} of an earlier job of this name to be deleted",
        )
    if rayjob is None:
        return Verdict("Pending", "Creating", "creating the RayJob and the runtime's ServiceAccount")
    verdict = _rayjob_phase(job, rayjob, seen.now)
    if verdict.phase == "Starting" and seen.pods is not None:
        return stuck_verdict(job, seen.pods, seen.now)
    if verdict.phase == "Succeeded":
        return _after_training(job, verdict, conversions)
    if verdict.phase == "Running" and seen.nodes is not None:
        return Verdict("Running", seen.nodes.reason, seen.nodes.message, degraded=True)
    return verdict


def _converting(job: Job, conversions: list[dict[str, Any]]) -> Verdict | None:
    """Before training: the model's Megatron checkpoint is being made (or failed); None once made."""
    want = megatron_conversion(job, RLJOB_CACHE)
    entry = entry_of(conversions, want)
    if entry is None or entry["state"] == SUCCEEDED:
        return None  # Pending until its RayJob exists; training's turn once it succeeded
    if entry["state"] == FAILED:
        what = f"converting {job.spec.model.path} to a Megatron checkpoint"
        return Verdict("Converting", CONVERSION_FAILED, failed_message(entry, what), stalled=True)
    return Verdict(
        "Converting",
        CONVERTING,
        f"converting {job.spec.model.path} to a Megatron checkpoint in the model cache (RayJob {want.name}; "
        "reused when an earlier job made it); training starts when it is done",
    )


def _after_training(job: Job, done: Verdict, conversions: list[dict[str, Any]]) -> Verdict:
    """Training succeeded: the job is Succeeded once its final export (checkpoint.export.huggingFace)
    is written, Converting until then."""
    want = final_export(job)
    if want is None:
        return done
    entry = entry_of(conversions, want)
    if entry is not None and entry["state"] == SUCCEEDED:
        return Verdict("Succeeded", done.reason, f"{done.message}; exported to {want.path}")
    if entry is not None and entry["state"] == FAILED:
        what = f"training finished; exporting iter_{want.step:07d} to {want.path}"
        return Verdict("Converting", EXPORT_FAILED, failed_message(entry, what), stalled=True)
    return Verdict(
        "Converting",
        EXPORTING,
        f"{done.message}; exporting it to {want.path} (RayJob {want.name})",
    )


def stuck_verdict(job: Job, stuck: Stuck, now: datetime) -> Verdict:
    """A starting job whose pods are stuck: the reason shows at once (Reconciling stays True, the
    cause may clear by itself); past faultTolerance.startupTimeoutSeconds it is Stalled, or Failed
    when onStartupTimeout is Fail. A cause only a person can clear stalls at once."""
    tolerance = job.spec.fault_tolerance
    timeout = tolerance.startup_timeout_seconds
    if stuck.overdue(now, timeout):
        message = f"{stuck.message} Stuck for over {timeout} s (faultTolerance.startupTimeoutSeconds)."
        if tolerance.on_startup_timeout == "Fail":
            return Verdict("Failed", stuck.reason, message)
        return Verdict("Starting", stuck.reason, message, stalled=True)
    return Verdict("Starting", stuck.reason, stuck.message, stalled=stuck.stalls_at_once)


_SUSPENDED = (
    "suspended by spec.suspend: the Ray cluster is deleted and its GPUs are free. "
    "Set suspend to false to resume from the latest checkpoint."
)


def _rayjob_phase(job: Job, rayjob: Mapping[str, Any], now: datetime) -> Verdict:
    status = rayjob.get("status") or {}
    deployment = status.get("jobDeploymentStatus", "")
    ray_status = status.get("jobStatus", "")
    message = status.get("message") or ""
    if deployment == "Complete" and ray_status == "SUCCEEDED":
        return Verdict("Succeeded", "Completed", _completed(job))
    failure = failure_of(rayjob)
    if failure is not None:
        if should_restart(job, failure):  # the reconciler records it, then deletes the RayJob
            return _restarting(job, restart_entry(job, failure, now))
        return _failed(job, rayjob, failure)
    suspended = deployment in ("Suspending", "Suspended") or (rayjob.get("spec") or {}).get("suspend")
    if suspended:
        if job.spec.suspend:
            return Verdict("Suspended", "Suspended", _SUSPENDED)
        if held_by_kueue(job, rayjob):
            return Verdict("Queued", WAITING_FOR_KUEUE, waiting_message(local_queue(job, rayjob)))
        return Verdict("Starting", "Resuming", "resuming from the latest checkpoint on a new Ray cluster")
    if ray_status == "RUNNING":
        return Verdict("Running", "Running", _running(job))
    if deployment == "Retrying":
        attempt = int(status.get("failed") or 0)
        return Verdict(
            "Starting",
            "Retrying",
            f"the Ray job failed (retry {attempt} of {job.spec.fault_tolerance.backoff_limit}) and is "
            f"retried on a new Ray cluster: {last_line(message) or 'no message'}",
        )
    cluster = status.get("rayClusterStatus") or {}
    ready, desired = cluster.get("readyWorkerReplicas", 0), cluster.get("desiredWorkerReplicas", 0)
    pods = f": {ready}/{desired} worker pods ready" if desired else ""
    return Verdict("Starting", "Starting", f"Ray cluster starting{pods}")


def _failed(job: Job, rayjob: Mapping[str, Any], failure: Failure) -> Verdict:
    """The runtime's one-line reason (the last line it printed, which KubeRay's message ends with
    after Ray's 'Job entrypoint command failed ... last available logs:' header) for the column;
    KubeRay's whole message for the Failed condition. A failure a restart could have cured, after
    backoffLimit restarts: BackoffLimitExceeded, 'failed after N restarts: <reason>'."""
    name = rayjob["metadata"]["name"]
    line, reason = failure.line, failure.reason
    if failure.retriable:
        reason = (rayjob.get("status") or {}).get("reason") or reason  # KubeRay's (AppFailed ...)
        if job.spec.fault_tolerance.backoff_limit > 0:
            reason, line = EXHAUSTED, exhausted_message(restarts(job, rayjob), line)
    whole = failure.detail
    detail = f"{line} (RayJob {name})" + (f"\nRayJob {name} says: {whole}" if whole and whole != line else "")
    return Verdict("Failed", reason, line, detail=detail)


def _restarting(job: Job, entry: Mapping[str, Any]) -> Verdict:
    return Verdict("Starting", RESTARTING, restarting_message(job, entry))


def _running(job: Job) -> str:
    progress = job.status.get("progress") or {}
    if not progress.get("stepText"):
        return progress.get("message") or "training started; waiting for the first step"
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


def _reason_and_message(kind: str, true: bool, verdict: Verdict) -> tuple[str, str]:
    """Ready: the verdict (the summary). A True condition: what made it True. A False one: its own."""
    if kind == "Ready" or true:
        long = kind in ("Failed", "Stalled") and verdict.detail
        return verdict.reason, verdict.detail if long else verdict.message
    if kind == "Reconciling":
        if verdict.stalled or verdict.phase == "Failed":
            return "Stalled", "cannot make progress: see the Stalled condition"
        if verdict.phase == "Queued":
            return "Queued", "waiting for admission: see the Queued condition"
        return "Reconciled", "the job's children match its spec"
    if kind == "Succeeded" and verdict.phase == "Failed":
        return "Failed", "the job failed: see the Failed condition"
    return _FALSE[kind]


def conditions(job: Job, verdict: Verdict, now: datetime) -> list[dict[str, Any]]:
    """All condition types, each True/False, keeping lastTransitionTime when status did not change."""
    true_types = set(_TRUE_IN_PHASE[verdict.phase])
    if verdict.stalled:
        true_types.add("Stalled")
        true_types.discard("Reconciling")
    if verdict.degraded:
        true_types.discard("Ready")
        true_types.add("Reconciling")
    out = []
    for kind in CONDITION_TYPES:
        true = kind in true_types
        reason, message = _reason_and_message(kind, true, verdict)
        out.append(_condition_entry(job, kind, true, reason, message, now))
    return out


def _condition_entry(
    job: Job, kind: str, true: bool, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    status = "True" if true else "False"
    old = _condition(job, kind)
    changed = old.get("status") != status
    return {
        "type": kind,
        "status": status,
        "observedGeneration": job.generation,
        "lastTransitionTime": old["lastTransitionTime"] if old and not changed else _time(now),
        "reason": reason,
        "message": message[:32768],
    }


def compute_status(job: Job, seen: Observed) -> dict[str, Any]:
    """The operator-owned part of status (everything but progress)."""
    converted = conversion_entries(job.status, list(seen.wanted), seen.conversions)
    verdict = decide_phase(job, seen, converted)
    status: dict[str, Any] = {
        "observedGeneration": job.generation,
        "phase": verdict.phase,
        "conditions": conditions(job, verdict, seen.now),
        "gpus": job.spec.total_gpus(),
    }
    queue = local_queue(job, seen.rayjob)  # spec.queueName, else the one Kueue's webhook chose
    if queue:
        status["queue"] = queue
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
    if converted:
        children["conversionJobs"] = [entry["rayJob"] for entry in converted]
        status["conversions"] = converted
    status["children"] = children
    count = restarts(job, seen.rayjob)
    if count:
        status["restarts"] = count
    entries = history(job.status)
    if entries:
        status["restartHistory"] = entries
    if job.status.get("preemptions"):
        status["preemptions"] = job.status["preemptions"]
    start = job.status.get("startTime") or rayjob_status.get("startTime")
    if start:
        status["startTime"] = start
    if verdict.phase in TERMINAL:
        status["completionTime"] = (
            job.status.get("completionTime") or rayjob_status.get("endTime") or _time(seen.now)
        )
    return status


def restart_status(job: Job, failure: Failure, rayjob: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status that records the restart `failure` of `rayjob` causes: one more in
    status.restarts and status.restartHistory (keyed by the RayJob's uid), phase Starting, reason
    Restarting. Written before the RayJob is deleted, so a restart is counted once whatever fails
    or restarts in between."""
    entry = restart_entry(job, failure, now)
    recorded = dataclasses.replace(job, status=with_restart(job.status, entry))
    return compute_status(recorded, Observed(now, rayjob=rayjob))


def holds_pods(status: Mapping[str, Any], rayjob: Mapping[str, Any] | None) -> bool:
    """Whether a Failed job's RayJob still runs (a startup timeout failed it, not the Ray job): it
    is suspended, so KubeRay deletes the Ray cluster and its pods stop holding quota."""
    if status.get("phase") != "Failed" or rayjob is None or (rayjob.get("spec") or {}).get("suspend"):
        return False
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus", "")
    return deployment not in ("Complete", "Failed", "ValidationFailed", "Suspending", "Suspended")


def error_status(job: Job, reason: str, message: str, now: datetime, *, stalled: bool) -> dict[str, Any]:
    """The job's status with an API error on it, the phase and everything else kept (the job itself
    may be fine). stalled: the API refused the operator (a permission, an invalid child, a webhook):
    Stalled=True until a pass succeeds. Otherwise a retried transient error: Reconciling=True with
    reason Retrying. Ready carries it too when Ready is False, so `-o wide` shows it."""
    base = dict(job.status) if job.status.get("conditions") else compute_status(job, Observed(now))
    kept = {key: value for key, value in base.items() if key != "progress"}
    phase = kept.get("phase") or "Pending"
    current = {c["type"]: dict(c) for c in kept.get("conditions") or []}
    changed = {"Stalled": (True, reason, message)} if stalled else {"Reconciling": (True, reason, message)}
    if stalled:
        changed["Reconciling"] = (False, "Stalled", "cannot make progress: see the Stalled condition")
    if current.get("Ready", {}).get("status") != "True":
        changed["Ready"] = (False, reason, message)
    out = []
    for kind in CONDITION_TYPES:
        if kind in changed:
            out.append(_condition_entry(job, kind, *changed[kind], now))
        elif kind in current:
            out.append(current[kind])
    return {**kept, "phase": phase, "conditions": out}


def announcement(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The event (type, reason, message) for a status change: every phase change ("A -> B: ..."),
    a new reason within a phase (a blocker found, changed or cleared) and a job becoming Stalled
    (a startup timeout passed); None when none of these."""
    ready = next(c for c in after["conditions"] if c["type"] == "Ready")
    old_ready: Mapping[str, Any] = next(
        (c for c in before.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    stalled = _is_true(after, "Stalled")
    trouble = (
        stalled
        or after["phase"] == "Failed"
        or ready["reason"] in (*STUCK_REASONS, NODE_NOT_READY, RETRYING, RESTARTING)
    )
    kind = "Warning" if trouble else "Normal"
    if before.get("phase") != after["phase"]:
        return (
            kind,
            ready["reason"],
            f"{before.get('phase') or 'New'} -> {after['phase']}: {ready['message']}",
        )
    if old_ready.get("reason") != ready["reason"] or (stalled and not _is_true(before, "Stalled")):
        return kind, ready["reason"], f"{after['phase']}: {ready['message']}"
    return None


def _is_true(status: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or [])


def status_changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether patching /status would change anything the operator owns."""
    return any(current.get(key) != value for key, value in desired.items())


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
