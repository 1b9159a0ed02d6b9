"""Whole-job restarts (pure): what a failed RayJob says about the failure, whether the job is
restarted or fails, and the status entry of each restart.

How a failure reaches the operator: Ray's job supervisor runs the entrypoint (`/bin/sh -c
"rljob-runtime train ..."`); when it exits non-zero the Ray job is FAILED with the message
"Job entrypoint command failed with exit code N, last available logs (truncated to 20,000
chars):\\n<the log's last lines>" (ray/dashboard/modules/job/job_supervisor.py). KubeRay copies
the Ray job's status and message into the RayJob's `status.jobStatus` / `status.message` and sets
`jobDeploymentStatus: Failed`, `reason: AppFailed` (ray-operator/controllers/ray/rayjob_controller.go);
it keeps no exit code of its own, so the code is read back from that message. N is the runtime's
exit status, or, when the process was killed by a signal, 128 + the signal (the shell reports it)
or minus the signal (Popen's returncode, when the shell exec'd the runtime).

The operator builds RayJobs with KubeRay's backoffLimit 0 and restarts the job itself: a failure
the runtime marks as not retriable (EXIT_NOT_RETRIABLE), a RayJob KubeRay refused
(ValidationFailed), an exceeded activeDeadlineSeconds or a stopped Ray job fails the job; any other
failure restarts it (a new RayJob, a new Ray cluster, resuming from the latest checkpoint) until
status.restarts reaches spec.faultTolerance.backoffLimit. A runtime that exited EXIT_PREEMPTED (it
stopped for a SIGTERM: a pod deleted, a node drained) is restarted as well, and not counted against
that limit (status.preemptions).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rljob_api.status import EXIT_NOT_RETRIABLE, EXIT_PREEMPTED, RESTART_HISTORY_MAX, RESTART_MESSAGE_MAX

from .job import Job

# Ray's JobSupervisor: f"Job entrypoint command failed with exit code {return_code}, last available
# logs ..." or f"... failed with exit code {return_code}. No logs available."
_RAY_EXIT = re.compile(r"Job entrypoint command failed with exit code (-?\d+)")
_RAY_LOG_HEADER = re.compile(r"^Job entrypoint command failed with exit code -?\d+[,.].*$")

KILLED = "DriverKilled"  # the runtime's process was killed (a signal): retried
RUNTIME_FAILED = "RuntimeFailed"  # it exited non-zero, not EXIT_NOT_RETRIABLE: retried
INVALID_JOB = "InvalidJob"  # it exited EXIT_NOT_RETRIABLE: the job as specified cannot run
PREEMPTED = "Preempted"  # it exited EXIT_PREEMPTED after a SIGTERM: restarted, not counted as a failure
EXHAUSTED = "BackoffLimitExceeded"  # retriable, but spec.faultTolerance.backoffLimit restarts are done
RESTARTING = "Restarting"  # the phase's reason from the failure until the new RayJob exists
# KubeRay reasons no restart can cure: the RayJob is invalid, or the whole job's deadline passed.
_TERMINAL_KUBERAY_REASONS = ("ValidationFailed", "DeadlineExceeded")


@dataclass(frozen=True)
class Failure:
    """A RayJob that failed, as the operator reads it."""

    uid: str  # the failed RayJob's metadata.uid: one attempt
    reason: str  # CamelCase
    line: str  # one line a person reads: the runtime's reason, or what happened to it
    detail: str  # KubeRay's whole message
    exit_code: int | None
    retriable: bool
    kuberay_retries: int = 0  # retries KubeRay made of this RayJob before (see kuberay_retries)


def exit_code(message: str) -> int | None:
    """The entrypoint's exit status in a Ray job's failure message, None if it has none (the job
    supervisor died, the runtime environment could not be set up, ...)."""
    found = _RAY_EXIT.search(message or "")
    return int(found.group(1)) if found else None


def killed_by(code: int | None) -> int | None:
    """The signal that killed the entrypoint, from its exit status: -N (Popen) or 128 + N (a shell)."""
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def last_line(message: str) -> str:
    """The last non-empty line of a message (the runtime prints its one-line reason last)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def failed(rayjob: Mapping[str, Any]) -> bool:
    status = rayjob.get("status") or {}
    deployment, ray_status = status.get("jobDeploymentStatus", ""), status.get("jobStatus", "")
    return deployment in ("Failed", "ValidationFailed") or (
        deployment == "Complete" and ray_status in ("FAILED", "STOPPED")
    )


def failure_of(rayjob: Mapping[str, Any] | None) -> Failure | None:
    """The failure of a RayJob that has failed, None while it has not."""
    if rayjob is None or not failed(rayjob):
        return None
    status = rayjob.get("status") or {}
    uid = str((rayjob.get("metadata") or {}).get("uid") or "")
    message = status.get("message") or ""
    kuberay_reason = status.get("reason") or ""
    ray_status = status.get("jobStatus") or ""
    code = exit_code(message)
    last = last_line(message)
    if _RAY_LOG_HEADER.match(last):  # Ray's header and no log after it
        last = ""
    last = last or f"the Ray job ended {ray_status or status.get('jobDeploymentStatus') or 'FAILED'}"
    detail = message.strip()

    def made(reason: str, line: str, retriable: bool) -> Failure:
        return Failure(uid, reason, line, detail, code, retriable, kuberay_retries(rayjob))

    if status.get("jobDeploymentStatus") == "ValidationFailed" or kuberay_reason in _TERMINAL_KUBERAY_REASONS:
        return made(kuberay_reason or "ValidationFailed", last, False)
    if ray_status == "STOPPED":  # someone stopped the Ray job (`ray job stop`): not a crash
        return made(kuberay_reason or "RayJobStopped", last, False)
    if code == EXIT_NOT_RETRIABLE:
        return made(INVALID_JOB, last, False)
    if code == EXIT_PREEMPTED:
        return made(PREEMPTED, last, True)
    signum = killed_by(code)
    if signum is not None:
        return made(KILLED, f"the runtime was killed by {_signal_name(signum)} (exit code {code})", True)
    if code is not None:
        return made(RUNTIME_FAILED, last, True)
    return made(kuberay_reason or "RayJobFailed", last, True)


# --- what the job's status says about restarts so far ---


def history(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(entry) for entry in status.get("restartHistory") or []]


def recorded_restarts(status: Mapping[str, Any]) -> int:
    return int(status.get("restarts") or 0)


def recorded_preemptions(status: Mapping[str, Any]) -> int:
    return int(status.get("preemptions") or 0)


def is_recorded(status: Mapping[str, Any], uid: str) -> bool:
    """Whether the failure of the RayJob with this uid was already counted as a restart."""
    return bool(uid) and any(entry.get("rayJobUid") == uid for entry in history(status))


def recreating(status: Mapping[str, Any]) -> bool:
    """Whether a RayJob created now replaces one deleted behind the operator's back (by hand, by a
    cleanup script): the job had one (status.children.rayJob) and no restart of the operator's own
    replaces it (Ready's reason is Restarting from the failure until the new RayJob exists)."""
    if not (status.get("children") or {}).get("rayJob"):
        return False
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return ready.get("reason") != RESTARTING


def restart_pending(job: Job, rayjob: Mapping[str, Any] | None) -> bool:
    """Between a recorded restart and its new RayJob: the failed one is still there (being
    deleted) or gone, and no new one exists yet."""
    entries = history(job.status)
    if not entries:
        return False
    if rayjob is None:
        return True
    return (rayjob.get("metadata") or {}).get("uid") == entries[-1].get("rayJobUid")


def kuberay_retries(rayjob: Mapping[str, Any] | None) -> int:
    """Retries KubeRay itself made of this RayJob: only a RayJob built with a backoffLimit above 0
    (by an operator before this one) has any; status.failed counts its failures, the last one
    included while it is failed."""
    if rayjob is None:
        return 0
    count = int((rayjob.get("status") or {}).get("failed") or 0)
    return max(0, count - 1) if failed(rayjob) else count


def restarts(job: Job, rayjob: Mapping[str, Any] | None) -> int:
    """status.restarts: the restarts the operator recorded, plus KubeRay's own retries of a RayJob
    an earlier operator built with a backoffLimit (counted in the record once it is restarted)."""
    uid = str(((rayjob or {}).get("metadata") or {}).get("uid") or "")
    extra = 0 if rayjob is None or is_recorded(job.status, uid) else kuberay_retries(rayjob)
    return recorded_restarts(job.status) + extra


def should_restart(job: Job, failure: Failure) -> bool:
    """Restart (True) or fail the job (False). A recorded failure is being restarted already."""
    if not failure.retriable:
        return False
    if is_recorded(job.status, failure.uid) or failure.reason == PREEMPTED:
        return True
    failures = recorded_restarts(job.status) - recorded_preemptions(job.status) + failure.kuberay_retries
    return failures < job.spec.fault_tolerance.backoff_limit


def restart_entry(job: Job, failure: Failure, now: datetime) -> dict[str, Any]:
    """The status.restartHistory entry of the restart `failure` causes."""
    entry: dict[str, Any] = {
        "attempt": recorded_restarts(job.status) + failure.kuberay_retries + 1,
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reason": failure.reason,
        "message": one_line(failure.line),
        "rayJobUid": failure.uid,
    }
    if failure.exit_code is not None:
        entry["exitCode"] = failure.exit_code
    return entry


def with_restart(status: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with one more restart: the count (the entry's attempt) and the history, bounded,
    most recent last."""
    entries = [*history(status), dict(entry)][-RESTART_HISTORY_MAX:]
    updated = {**status, "restarts": entry["attempt"], "restartHistory": entries}
    if entry["reason"] == PREEMPTED:
        updated["preemptions"] = recorded_preemptions(status) + 1
    return updated


def restarting_message(job: Job, entry: Mapping[str, Any]) -> str:
    """Ready's message during a restart (the `-o wide` column) and the Restarting event's."""
    limit = job.spec.fault_tolerance.backoff_limit
    if job.spec.checkpoint.resume == "never":
        then = "a new Ray job starts over (checkpoint.resume: never)"
    else:
        then = "a new Ray job resumes from the latest checkpoint"
    if entry["reason"] == PREEMPTED:
        counted = f"restart {entry['attempt']} after {PREEMPTED} (not counted against backoffLimit {limit})"
    else:
        counted = f"restart {entry['attempt']} of {limit} after {entry['reason']}"
    return f"{counted}: {entry.get('message') or 'no message'}; {then}"


def exhausted_message(count: int, line: str) -> str:
    return f"failed after {count} restart{'s' if count != 1 else ''}: {line}"


def one_line(text: str) -> str:
    """`text` on one line, at most RESTART_MESSAGE_MAX characters (a status message)."""
    one = " ".join(text.split())
    return one if len(one) <= RESTART_MESSAGE_MAX else one[: RESTART_MESSAGE_MAX - 3] + "..."
