"""Whole-job restarts, the pure half: the exit status read back from Ray's job message (in the
format Ray's job supervisor writes it), which failures are retried, the status of a restart and of
a job whose restarts are used up."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import NOW, job_from_spec

from rljob_api.status import EXIT_NOT_RETRIABLE, EXIT_PREEMPTED, RESTART_HISTORY_MAX, RLTrainingJobStatus
from rljob_operator.build import BuildSettings, build_rayjob
from rljob_operator.restarts import (
    exit_code,
    failure_of,
    killed_by,
    restart_entry,
    restarts,
    should_restart,
    with_restart,
)
from rljob_operator.status import Observed, announcement, compute_status, decide_phase, restart_status

LOGS = (
    "Job entrypoint command failed with exit code {code}, last available logs (truncated to 20,000 chars):\n"
)


def ray_message(code: int, *log_lines: str) -> str:
    """What Ray's JobSupervisor writes as the failed job's message (KubeRay copies it verbatim)."""
    if not log_lines:
        return f"Job entrypoint command failed with exit code {code}. No logs available."
    return LOGS.format(code=code) + "\n".join(log_lines) + "\n"


def test_the_message_format_is_the_one_the_installed_ray_writes() -> None:
    """If Ray rewords its message, the exit status can no longer be read back: fail here first."""
    import ray.dashboard.modules.job.job_supervisor as supervisor

    source = Path(supervisor.__file__).read_text()
    for piece in (
        '"Job entrypoint command "',
        'f"failed with exit code {return_code}, "',
        '"last available logs (truncated to 20,000 chars):\\n"',
        'f"failed with exit code {return_code}. No logs available."',
        "driver_exit_code=return_code",
    ):
        assert piece in source, piece
    assert exit_code(ray_message(78, "rljob-runtime: failed: x")) == 78
    assert exit_code(ray_message(-9)) == -9
    assert exit_code("Job supervisor actor died: the node was terminated") is None
    assert exit_code("") is None


@pytest.mark.parametrize(
    ("code", "signal_number"), [(1, None), (78, None), (130, 2), (137, 9), (143, 15), (-9, 9), (255, None)]
)
def test_a_signal_shows_as_minus_n_or_128_plus_n(code: int, signal_number: int | None) -> None:
    assert killed_by(code) == signal_number


def rayjob(deployment: str, job_status: str = "", uid: str = "rj-1", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-a", "uid": uid},
        "spec": {},
        "status": {"jobDeploymentStatus": deployment, "jobStatus": job_status, **status},
    }


def failed(message: str, uid: str = "rj-1", **status: Any) -> dict[str, Any]:
    return rayjob("Failed", "FAILED", uid=uid, reason="AppFailed", message=message, **status)


CASES = [
    # (label, the RayJob, reason, line, retriable)
    (
        "killed (shell)",
        failed(ray_message(137, "step 3/10")),
        "DriverKilled",
        "the runtime was killed by SIGKILL (exit code 137)",
        True,
    ),
    (
        "killed (exec)",
        failed(ray_message(-9)),
        "DriverKilled",
        "the runtime was killed by SIGKILL (exit code -9)",
        True,
    ),
    (
        "runtime error",
        failed(ray_message(1, "Traceback ...", "rljob-runtime: failed: trainer died")),
        "RuntimeFailed",
        "rljob-runtime: failed: trainer died",
        True,
    ),
    (
        "refused by the runtime",
        failed(ray_message(EXIT_NOT_RETRIABLE, "rljob-runtime: failed: no such file")),
        "InvalidJob",
        "rljob-runtime: failed: no such file",
        False,
    ),
    (
        "supervisor died",
        failed("Job supervisor actor died: node lost"),
        "AppFailed",
        "Job supervisor actor died: node lost",
        True,
    ),
    ("no logs", failed(ray_message(1)), "RuntimeFailed", "the Ray job ended FAILED", True),
    (
        "submitter",
        rayjob("Failed", "", reason="SubmissionFailed", message="submitter job failed"),
        "SubmissionFailed",
        "submitter job failed",
        True,
    ),
    (
        "kuberay refused it",
        rayjob("ValidationFailed", "", reason="ValidationFailed", message="bad RayJob"),
        "ValidationFailed",
        "bad RayJob",
        False,
    ),
    (
        "deadline",
        rayjob("Failed", "", reason="DeadlineExceeded", message="passed activeDeadlineSeconds"),
        "DeadlineExceeded",
        "passed activeDeadlineSeconds",
        False,
    ),
    ("stopped", rayjob("Complete", "STOPPED"), "RayJobStopped", "the Ray job ended STOPPED", False),
    (
        "preempted",
        failed(
            ray_message(
                EXIT_PREEMPTED,
                "rljob-runtime: preempted after step 3; the job resumes from its checkpoint /c/iter_0000003",
            )
        ),
        "Preempted",
        "rljob-runtime: preempted after step 3; the job resumes from its checkpoint /c/iter_0000003",
        True,
    ),
]


@pytest.mark.parametrize(("label", "obj", "reason", "line", "retriable"), CASES, ids=[c[0] for c in CASES])
def test_each_failure_is_classified(
    label: str, obj: dict[str, Any], reason: str, line: str, retriable: bool
) -> None:
    failure = failure_of(obj)
    assert failure is not None
    assert (failure.reason, failure.line, failure.retriable, failure.uid) == (reason, line, retriable, "rj-1")


def test_a_rayjob_that_has_not_failed_has_no_failure() -> None:
    for obj in (rayjob("Running", "RUNNING"), rayjob("Complete", "SUCCEEDED"), rayjob("Retrying", "FAILED")):
        assert failure_of(obj) is None
    assert failure_of(None) is None


def test_restarts_up_to_the_backoff_limit() -> None:
    failure = failure_of(failed(ray_message(137)))
    assert failure is not None
    job = job_from_spec({"faultTolerance": {"backoffLimit": 2}})
    assert should_restart(job, failure)
    one = with_restart({}, restart_entry(job, failure, NOW))
    assert should_restart(job_from_spec({"faultTolerance": {"backoffLimit": 2}}, status=one), failure)
    other = failure_of(failed(ray_message(137), uid="rj-2"))
    assert other is not None
    two = with_restart(one, restart_entry(job_from_spec(status=one), other, NOW))
    exhausted = job_from_spec({"faultTolerance": {"backoffLimit": 2}}, status=two)
    third = failure_of(failed(ray_message(1, "boom"), uid="rj-3"))
    assert third is not None and not should_restart(exhausted, third)
    assert should_restart(exhausted, other)  # recorded already: its restart is under way
    assert not should_restart(job_from_spec(), failure)  # backoffLimit 0


def test_preemptions_restart_without_counting_against_the_backoff_limit() -> None:
    preempted = failure_of(
        failed(ray_message(EXIT_PREEMPTED, "rljob-runtime: preempted after step 3"), uid="p-1")
    )
    crashed = failure_of(failed(ray_message(137), uid="c-1"))
    assert preempted is not None and crashed is not None
    limit = {"faultTolerance": {"backoffLimit": 1}}
    status: dict[str, Any] = {}
    for uid in ("p-1", "p-2", "p-3"):  # more preemptions than the limit allows failures
        job = job_from_spec(limit, status=status)
        failure = failure_of(failed(ray_message(EXIT_PREEMPTED, "preempted"), uid=uid))
        assert failure is not None and should_restart(job, failure)
        status = with_restart(status, restart_entry(job, failure, NOW))
    assert (status["restarts"], status["preemptions"]) == (3, 3)
    RLTrainingJobStatus.model_validate_json(json.dumps(status))
    job = job_from_spec(limit, status=status)
    assert should_restart(job, crashed)  # the one failure backoffLimit 1 allows
    status = with_restart(status, restart_entry(job, crashed, NOW))
    assert (status["restarts"], status["preemptions"]) == (4, 3)
    other = failure_of(failed(ray_message(1, "boom"), uid="c-2"))
    assert other is not None and not should_restart(job_from_spec(limit, status=status), other)
    assert should_restart(job_from_spec(limit, status=status), preempted)  # preemptions always


def test_a_preemption_restart_says_it_is_not_counted() -> None:
    spec = {"faultTolerance": {"backoffLimit": 2}}
    running = compute_status(job_from_spec(spec), Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    old = failed(ray_message(EXIT_PREEMPTED, "rljob-runtime: preempted after step 3"))
    failure = failure_of(old)
    assert failure is not None
    recorded = restart_status(job_from_spec(spec, status=running), failure, old, NOW)
    assert (recorded["phase"], recorded["restarts"], recorded["preemptions"]) == ("Starting", 1, 1)
    ready = next(c for c in recorded["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        "restart 1 after Preempted (not counted against backoffLimit 2): rljob-runtime: preempted after "
        "step 3; a new Ray job resumes from the latest checkpoint"
    )
    later = compute_status(job_from_spec(spec, status=recorded), Observed(NOW))
    assert later["preemptions"] == 1  # kept by every later status


def test_the_history_is_bounded_and_one_line_most_recent_last() -> None:
    job = job_from_spec({"faultTolerance": {"backoffLimit": 50}})
    status: dict[str, Any] = {}
    for n in range(1, 15):
        failure = failure_of(failed(ray_message(1, "x" * 600 + "\nboom " * 3), uid=f"rj-{n}"))
        assert failure is not None
        status = with_restart(status, restart_entry(job_from_spec(status=status), failure, NOW))
    assert status["restarts"] == 14
    entries = status["restartHistory"]
    assert len(entries) == RESTART_HISTORY_MAX
    assert [e["attempt"] for e in entries] == list(range(5, 15))
    assert [e["rayJobUid"] for e in entries][-1] == "rj-14"
    RLTrainingJobStatus.model_validate_json(json.dumps({"restarts": 14, "restartHistory": entries}))
    long = failure_of(failed(ray_message(1, "y" * 2000)))
    assert long is not None
    entry = restart_entry(job, long, NOW)
    assert len(entry["message"]) == 512 and entry["message"].endswith("...") and "\n" not in entry["message"]


def test_a_restart_is_starting_restarting_until_the_new_rayjob_exists() -> None:
    job = job_from_spec({"faultTolerance": {"backoffLimit": 2}})
    running = compute_status(job, Observed(NOW, rayjob=rayjob("Running", "RUNNING")))
    old = failed(ray_message(137, "step 3/10"))
    failure = failure_of(old)
    assert failure is not None
    recorded = restart_status(
        job_from_spec({"faultTolerance": {"backoffLimit": 2}}, status=running), failure, old, NOW
    )
    assert (recorded["phase"], recorded["restarts"]) == ("Starting", 1)
    RLTrainingJobStatus.model_validate_json(json.dumps(recorded))  # every field is in the CRD schema
    ready = next(c for c in recorded["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Restarting"
    assert ready["message"] == (
        "restart 1 of 2 after DriverKilled: the runtime was killed by SIGKILL (exit code 137); "
        "a new Ray job resumes from the latest checkpoint"
    )
    assert announcement(running, recorded) == (
        "Warning",
        "Restarting",
        f"Running -> Starting: {ready['message']}",
    )
    later = job_from_spec({"faultTolerance": {"backoffLimit": 2}}, status=recorded)
    for gone_or_going in (None, {**old, "metadata": {**old["metadata"], "deletionTimestamp": "x"}}):
        verdict = decide_phase(later, Observed(NOW + timedelta(seconds=5), rayjob=gone_or_going))
        assert (verdict.phase, verdict.reason) == ("Starting", "Restarting")
    fresh = decide_phase(later, Observed(NOW, rayjob=rayjob("Initializing", uid="rj-2")))
    assert (fresh.phase, fresh.reason) == ("Starting", "Starting")
    again = compute_status(later, Observed(NOW, rayjob=rayjob("Running", "RUNNING", uid="rj-2")))
    assert again["phase"] == "Running" and again["restarts"] == 1 and len(again["restartHistory"]) == 1
    never = job_from_spec(
        {"faultTolerance": {"backoffLimit": 2}, "checkpoint": {"resume": "never"}}, status=recorded
    )
    assert decide_phase(never, Observed(NOW)).message.endswith(
        "a new Ray job starts over (checkpoint.resume: never)"
    )


def test_a_failed_job_says_how_many_restarts_it_had() -> None:
    job = job_from_spec({"faultTolerance": {"backoffLimit": 1}})
    first = failed(ray_message(137))
    f1 = failure_of(first)
    assert f1 is not None
    recorded = restart_status(job, f1, first, NOW)
    last = failed(ray_message(1, "Traceback", "rljob-runtime: failed: CUDA out of memory"), uid="rj-2")
    done = compute_status(
        job_from_spec({"faultTolerance": {"backoffLimit": 1}}, status=recorded), Observed(NOW, rayjob=last)
    )
    ready = next(c for c in done["conditions"] if c["type"] == "Ready")
    failed_condition = next(c for c in done["conditions"] if c["type"] == "Failed")
    assert done["phase"] == "Failed" and done["restarts"] == 1
    assert (ready["reason"], ready["message"]) == (
        "BackoffLimitExceeded",
        "failed after 1 restart: rljob-runtime: failed: CUDA out of memory",
    )
    assert "Traceback" in failed_condition["message"] and failed_condition["reason"] == "BackoffLimitExceeded"
    refused = failed(ray_message(EXIT_NOT_RETRIABLE, "rljob-runtime: failed: bad data"))
    final = compute_status(
        job_from_spec({"faultTolerance": {"backoffLimit": 3}}), Observed(NOW, rayjob=refused)
    )
    assert final["phase"] == "Failed" and "restarts" not in final
    assert next(c for c in final["conditions"] if c["type"] == "Ready")["reason"] == "InvalidJob"


def test_kuberays_own_retries_of_an_older_operators_rayjob_count() -> None:
    """A RayJob built before this operator (KubeRay backoffLimit 2) that KubeRay retried once."""
    job = job_from_spec({"faultTolerance": {"backoffLimit": 2}})
    retried = rayjob("Running", "RUNNING", failed=1)
    assert restarts(job, retried) == 1
    assert compute_status(job, Observed(NOW, rayjob=retried))["restarts"] == 1
    twice = failed(ray_message(137), failed=3)  # failed again after KubeRay's own 2 retries
    failure = failure_of(twice)
    assert failure is not None and failure.kuberay_retries == 2 and not should_restart(job, failure)
    ours = failed(ray_message(137), failed=1)  # built with backoffLimit 0: its one failure
    assert restarts(job, ours) == 0


def test_the_rayjob_leaves_retries_to_the_operator_and_a_restart_keeps_the_deadline() -> None:
    job = job_from_spec({"faultTolerance": {"backoffLimit": 3}, "activeDeadlineSeconds": 3600})
    spec = build_rayjob(job, BuildSettings(), suspend=False)["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 3600)
    status = {
        "startTime": "2026-11-22T10:00:00Z",
        "restarts": 1,
        "restartHistory": [
            {"attempt": 1, "time": "2026-11-22T10:25:00Z", "reason": "DriverKilled", "rayJobUid": "rj-1"}
        ],
    }
    restarted = job_from_spec(
        {"faultTolerance": {"backoffLimit": 3}, "activeDeadlineSeconds": 3600}, status=status
    )
    assert build_rayjob(restarted, BuildSettings(), suspend=False)["spec"]["activeDeadlineSeconds"] == 2100
    late = {**status, "restartHistory": [{**status["restartHistory"][0], "time": "2026-11-22T12:00:00Z"}]}
    overdue = job_from_spec({"activeDeadlineSeconds": 3600}, status=late)
    assert build_rayjob(overdue, BuildSettings(), suspend=False)["spec"]["activeDeadlineSeconds"] == 1


def test_a_rayjob_is_recreated_only_where_one_existed_and_no_restart_replaces_it() -> None:
    from rljob_operator.restarts import RESTARTING, recreating

    def status(children: dict[str, str], reason: str) -> dict[str, object]:
        return {"children": children, "conditions": [{"type": "Ready", "status": "False", "reason": reason}]}

    assert not recreating({})  # a new job
    assert not recreating(status({"serviceAccount": "a-runtime"}, "Creating"))  # none made yet
    assert not recreating(status({"rayJob": "a"}, RESTARTING))  # the operator's own restart
    assert recreating(status({"rayJob": "a"}, "Starting"))
    assert recreating(status({"rayJob": "a", "rayCluster": "a-x"}, "Running"))
