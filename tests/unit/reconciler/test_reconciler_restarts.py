"""Whole-job restarts by the operator: a RayJob that failed for a retriable reason is recorded in
status once (keyed by its uid), deleted, and replaced by a new one, up to backoffLimit; a failure
the runtime marks as final, or one past the limit, fails the job. An operator that dies anywhere in
between neither counts a restart twice nor creates two RayJobs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fake_kube import RAYJOB, Harness, server_error

KILLED = (
    "Job entrypoint command failed with exit code 137, last available logs (truncated to 20,000 chars):\n"
    "step 3/10: reward 0.41\n"
)
REFUSED = (
    "Job entrypoint command failed with exit code 78, last available logs (truncated to 20,000 chars):\n"
    "rljob-runtime: failed: prompt data /data/missing.jsonl: no such file\n"
)
CRASHED = (
    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    "Traceback (most recent call last):\n  ...\n"
    "rljob-runtime: failed: the trainer actor died: node gpu-3 was drained\n"
)


def _running(backoff_limit: int, **spec: Any) -> Harness:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a", {"faultTolerance": {"backoffLimit": backoff_limit}, **spec})
    h.reconcile("job-a")
    h.kube.set_rayjob_status(
        "job-a", jobDeploymentStatus="Running", jobStatus="RUNNING", startTime="2026-11-22T10:05:00Z"
    )
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Running"
    return h


def _fail(h: Harness, message: str) -> str:
    """KubeRay's status once the Ray job failed; returns the failed RayJob's uid."""
    h.kube.set_rayjob_status(
        "job-a", jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed", message=message
    )
    return _uid(h)


def _uid(h: Harness) -> str:
    return (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"]


def _rayjobs_created(h: Harness) -> int:
    return sum(1 for e in h.events if e[1] == "Created")


def test_a_killed_driver_is_recorded_once_then_the_rayjob_is_deleted_and_created_again() -> None:
    h = _running(backoff_limit=2)
    old = _fail(h, KILLED)
    before, now = len(h.kube.calls), h.kube.now()
    h.reconcile("job-a")
    status = h.status("job-a")
    assert status["restarts"] == 1
    (entry,) = status["restartHistory"]
    assert entry == {
        "attempt": 1,
        "time": _stamp(now),
        "reason": "DriverKilled",
        "message": "the runtime was killed by SIGKILL (exit code 137)",
        "exitCode": 137,
        "rayJobUid": old,
    }
    # Recorded first, then deleted, then a new RayJob (a new uid) created, in this order.
    steps = [
        c.method if c.method != "apply" else f"apply:{c.args[0]['kind']}"
        for c in h.kube.calls[before:]
        if c.method in ("apply_job_status", "delete_rayjob", "apply")
    ]
    assert steps[:2] == ["apply_job_status", "delete_rayjob"]
    assert steps[-2:] == ["apply:RayJob", "apply_job_status"]
    assert h.kube.calls_to("delete_rayjob")[0].args == ("ml", "job-a", old)
    assert _uid(h) != old and _rayjobs_created(h) == 2
    assert (h.status("job-a")["phase"], h.condition("job-a", "Ready")["reason"]) == ("Starting", "Starting")
    warning = next(e for e in h.events if e[1] == "Restarting")
    assert warning == (
        "Warning",
        "Restarting",
        "Running -> Starting: restart 1 of 2 after DriverKilled: the runtime was killed by SIGKILL "
        "(exit code 137); a new Ray job resumes from the latest checkpoint",
    )
    # Nothing more happens on later passes: one restart, one delete, one new RayJob.
    for _ in range(3):
        h.reconcile("job-a")
    assert h.status("job-a")["restarts"] == 1 and len(h.kube.calls_to("delete_rayjob")) == 1
    assert _rayjobs_created(h) == 2
    # The new RayJob runs: Running again, restarts kept; the metric follows.
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    status = h.status("job-a")
    assert (status["phase"], status["restarts"], len(status["restartHistory"])) == ("Running", 1, 1)
    assert status["startTime"] == "2026-11-22T10:05:00Z"  # the job's, not the new RayJob's
    samples = {"namespace": "ml", "name": "job-a"}
    assert h.registry.get_sample_value("rljob_job_restarts_total", samples) == 1


def test_the_new_rayjob_waits_until_the_failed_one_is_gone() -> None:
    h = _running(backoff_limit=1)
    h.kube.slow_deletes = True  # KubeRay's finalizer; the foreground deletion of its Ray cluster
    old = _fail(h, CRASHED)
    h.reconcile("job-a")
    before = len(h.kube.calls)
    h.reconcile("job-a")  # still terminating: nothing applied to it, no second delete, no pod list
    assert [c.method for c in h.kube.calls[before:]] == ["get_job", "get_rayjob"]
    assert _uid(h) == old and _rayjobs_created(h) == 1
    ready = h.condition("job-a", "Ready")
    assert (h.status("job-a")["phase"], ready["reason"]) == ("Starting", "Restarting")
    assert ready["message"] == (
        "restart 1 of 1 after RuntimeFailed: rljob-runtime: failed: the trainer actor died: node gpu-3 "
        "was drained; a new Ray job resumes from the latest checkpoint"
    )
    h.kube.delete(RAYJOB, "ml", "job-a")  # gone: its deletion is an event, a pass follows
    h.reconcile("job-a")
    assert _uid(h) != old and _rayjobs_created(h) == 2
    assert h.status("job-a")["restarts"] == 1


def test_an_operator_dying_after_the_record_deletes_and_creates_exactly_once() -> None:
    h = _running(backoff_limit=2)
    old = _fail(h, KILLED)
    h.kube.fail("delete_rayjob", server_error())
    h.reconcile("job-a")  # recorded, then the delete fails: the pass errors out
    assert h.status("job-a")["restarts"] == 1 and _uid(h) == old
    again = _operator_restarted(h)
    again.reconcile("job-a")
    assert again.status("job-a")["restarts"] == 1
    assert [c.args[2] for c in again.kube.calls_to("delete_rayjob")] == [old, old]
    assert _uid(again) != old and _rayjobs_created(again) == 1  # this operator's one creation
    assert not [e for e in again.events if e[1] == "Restarting"]  # announced by the first operator


def test_an_operator_dying_between_the_delete_and_the_create_creates_one_rayjob() -> None:
    h = _running(backoff_limit=2)
    old = _fail(h, KILLED)
    h.kube.fail("apply", server_error(), when=lambda obj, **_: obj["kind"] == "RayJob")
    h.reconcile("job-a")  # recorded and deleted; the new RayJob's create fails
    assert h.kube.get(RAYJOB, "ml", "job-a") is None
    assert (h.status("job-a")["phase"], h.condition("job-a", "Ready")["reason"]) == ("Starting", "Restarting")
    again = _operator_restarted(h)  # status says a restart is pending, the old RayJob is gone
    again.reconcile("job-a")
    again.reconcile("job-a")
    assert _uid(again) != old and _rayjobs_created(again) == 1
    assert again.status("job-a")["restarts"] == 1 and len(again.kube.calls_to("delete_rayjob")) == 1


def test_a_failure_the_runtime_marks_final_fails_the_job_without_a_restart() -> None:
    h = _running(backoff_limit=2)
    _fail(h, REFUSED)
    h.reconcile("job-a")
    status = h.status("job-a")
    assert status["phase"] == "Failed" and "restarts" not in status and "restartHistory" not in status
    ready, failed = h.condition("job-a", "Ready"), h.condition("job-a", "Failed")
    assert (ready["reason"], failed["reason"]) == ("InvalidJob", "InvalidJob")
    assert ready["message"] == "rljob-runtime: failed: prompt data /data/missing.jsonl: no such file"
    assert h.kube.calls_to("delete_rayjob") == [] and _rayjobs_created(h) == 1


def test_kuberay_refusing_the_rayjob_is_not_retried() -> None:
    h = _running(backoff_limit=2)
    h.kube.set_rayjob_status(
        "job-a", jobDeploymentStatus="ValidationFailed", reason="ValidationFailed", message="bad spec"
    )
    h.reconcile("job-a")
    assert (h.status("job-a")["phase"], h.condition("job-a", "Failed")["reason"]) == (
        "Failed",
        "ValidationFailed",
    )
    assert h.kube.calls_to("delete_rayjob") == []


def test_restarts_stop_at_the_backoff_limit_and_the_job_fails_with_the_count() -> None:
    h = _running(backoff_limit=1)
    _fail(h, KILLED)
    h.reconcile("job-a")
    assert h.status("job-a")["restarts"] == 1
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    last = _fail(h, CRASHED)
    h.reconcile("job-a")
    status = h.status("job-a")
    assert (status["phase"], status["restarts"], len(status["restartHistory"])) == ("Failed", 1, 1)
    ready, failed = h.condition("job-a", "Ready"), h.condition("job-a", "Failed")
    assert ready["reason"] == failed["reason"] == "BackoffLimitExceeded"
    assert ready["message"] == (
        "failed after 1 restart: rljob-runtime: failed: the trainer actor died: node gpu-3 was drained"
    )
    assert "Traceback" in failed["message"]  # KubeRay's whole message
    assert len(h.kube.calls_to("delete_rayjob")) == 1 and _uid(h) == last
    assert h.events[-1][:2] == ("Warning", "BackoffLimitExceeded")
    h.reconcile("job-a")  # final
    assert h.status("job-a")["phase"] == "Failed" and len(h.kube.calls_to("delete_rayjob")) == 1


def test_without_a_backoff_limit_the_first_failure_is_final_as_before() -> None:
    h = _running(backoff_limit=0)
    _fail(h, CRASHED)
    h.reconcile("job-a")
    assert (h.status("job-a")["phase"], h.condition("job-a", "Failed")["reason"]) == ("Failed", "AppFailed")
    assert h.condition("job-a", "Ready")["message"].startswith("rljob-runtime: failed: the trainer actor")
    assert h.kube.calls_to("delete_rayjob") == []


def test_a_restarted_rayjob_gets_what_is_left_of_the_active_deadline() -> None:
    h = _running(backoff_limit=1, activeDeadlineSeconds=3600)
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["activeDeadlineSeconds"] == 3600
    h.kube.advance(600)
    _fail(h, KILLED)
    restart = h.kube.now()
    h.reconcile("job-a")
    assert h.status("job-a")["startTime"] == "2026-11-22T10:05:00Z"  # the job's first start
    spent = restart - datetime(2026, 11, 22, 10, 5, tzinfo=UTC)
    assert spent.total_seconds() > 300  # advanced 600 s past a clock 5 min before that start
    left = 3600 - int(spent.total_seconds())
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["activeDeadlineSeconds"] == left
    h.kube.advance(60)
    h.reconcile("job-a")  # re-applied every pass: the same value
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["activeDeadlineSeconds"] == left


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _rayjob_applies(h: Harness) -> list[Any]:
    return [c for c in h.kube.calls_to("apply") if c.args[0]["kind"] == "RayJob"]


def _operator_restarted(h: Harness) -> Harness:
    """A new operator process (a fresh Reconciler: no memory) on the same API server."""
    again = Harness()
    again.kube = h.kube
    again.reconciler.kube = h.kube  # type: ignore[assignment]
    again.reconciler.clock = h.kube.now
    h.kube.heal()
    return again


def test_a_job_deleted_and_created_again_waits_for_the_old_jobs_rayjob_to_go() -> None:
    """`kubectl replace --force` (or a GitOps re-create) of a Failed job: the new job must neither
    take over the old job's RayJob (Failed, refused) nor apply onto it; it waits for garbage
    collection, then starts."""
    h = _running(backoff_limit=2)
    _fail(h, REFUSED)
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Failed"
    old = h.kube.get("rljob.dev/v1alpha1/RLTrainingJob", "ml", "job-a") or {}
    # Deleted (the RayJob left behind, as background garbage collection does for a moment) and
    # created again with the fix.
    h.kube.store.pop(("rljob.dev/v1alpha1/RLTrainingJob", "ml", "job-a"))
    h.kube.create_job("job-a", {"faultTolerance": {"backoffLimit": 2}})
    new = h.kube.get("rljob.dev/v1alpha1/RLTrainingJob", "ml", "job-a") or {}
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    before = len(_rayjob_applies(h))
    h.reconcile("job-a")
    ready = h.condition("job-a", "Ready")
    assert (h.status("job-a")["phase"], ready["reason"]) == ("Pending", "Creating")
    assert ready["message"] == "waiting for RayJob job-a of an earlier job of this name to be deleted"
    assert len(_rayjob_applies(h)) == before and h.kube.calls_to("delete_rayjob") == []
    h.kube.delete(RAYJOB, "ml", "job-a")  # garbage collection
    h.reconcile("job-a")
    rayjob = h.kube.get(RAYJOB, "ml", "job-a") or {}
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]
    assert h.status("job-a")["phase"] == "Starting" and "restarts" not in h.status("job-a")
