"""A failed API call never crashes the operator: the pass is counted as an error and retried with
growing delays (no real waiting here: the retry timers are recorded and fired by hand), and the
first pass that succeeds resets the backoff."""

from __future__ import annotations

from typing import Any

from fake_kube import JOB, RAYJOB, conflict, one_gpu_job, server_error, timeout

from rljob_operator.reconcile import BACKOFF_SECONDS

KEY = ("ml", "job-a")


def _shown(status: dict[str, Any]) -> tuple[str, str]:
    """(phase, the Reconciling condition's reason, or its message while retrying)."""
    reconciling = next(c for c in status["conditions"] if c["type"] == "Reconciling")
    return status["phase"], reconciling["message"] if reconciling["reason"] == "Retrying" else reconciling[
        "reason"
    ]


def _rayjob(obj: dict[str, Any], *_: Any, **__: Any) -> bool:
    return obj["kind"] == "RayJob"


def test_a_500_a_timeout_and_a_conflict_are_retried_with_backoff_then_recovered() -> None:
    h = one_gpu_job()
    h.kube.fail("apply", server_error(), when=_rayjob)
    h.reconcile("job-a")  # does not raise
    assert (h.reconciles("error"), [t.delay for t in h.timers]) == (1, [1])
    assert h.reconciler._failures[KEY] == 1
    assert h.status("job-a")["phase"] == "Pending"  # written before the children
    for exc in (timeout(), conflict("rayjobs", "ray.io", "job-a")):
        h.kube.fail("apply", exc, when=_rayjob)
        h.fire_retry()
    assert [t.delay for t in h.timers] == [1, 2, 5]
    assert (h.reconciles("error"), h.reconciler._failures[KEY]) == (3, 3)
    assert h.fire_retry() == 5  # the failures are over
    assert h.reconciles("ok") == 1
    assert KEY not in h.reconciler._failures
    assert len(h.timers) == 3  # no further retry
    assert h.kube.get(RAYJOB, "ml", "job-a") is not None
    assert h.status("job-a")["phase"] == "Starting"
    # Pending; then the retries shown from the 2nd failure on, counted; then the recovery.
    shown = [_shown(s.args[2]) for s in h.kube.calls_to("apply_job_status")]
    assert shown == [
        ("Pending", "Creating"),
        (
            "Pending",
            "retrying (attempt 2) in 2 s: applying RayJob job-a: TimeoutError: no answer from the API server within "
            "60 s (patch_namespaced_custom_object)",
        ),
        ("Pending", shown[2][1]),
        ("Starting", "Starting"),
    ]
    assert shown[2][1].startswith(
        "retrying (attempt 3) in 5 s: applying RayJob job-a: API error 409 Conflict: Operation cannot"
    )
    assert [e[:2] for e in h.events].count(("Warning", "Retrying")) == 1  # one event, not one per attempt
    assert h.condition("job-a", "Reconciling")["reason"] == "Starting"
    h.kube.fail("apply", server_error(), when=_rayjob)
    h.reconciler.reapply_all()  # as a resync pass does: the unchanged RayJob is applied again
    h.reconcile("job-a")
    assert h.timers[-1].delay == BACKOFF_SECONDS[0]  # a new failure starts over


def test_the_backoff_grows_to_its_last_delay_and_stays_there() -> None:
    h = one_gpu_job()
    h.kube.fail("get_job", server_error(), times=None)
    h.reconcile("job-a")
    for _ in range(len(BACKOFF_SECONDS) + 1):
        h.fire_retry()
    assert [t.delay for t in h.timers] == [*BACKOFF_SECONDS, BACKOFF_SECONDS[-1], BACKOFF_SECONDS[-1]]
    assert sum(not t.cancelled for t in h.timers) == 1  # one pending retry per job, never a pile
    assert h.kube.calls_to("apply", "apply_job_status") == []
    assert h.events == []  # the job cannot even be read: nothing can be written on it


def test_a_deleted_job_leaves_no_per_job_state_in_the_reconciler() -> None:
    h = one_gpu_job()
    h.kube.fail("apply", server_error(), when=_rayjob)
    h.reconcile("job-a")
    h.kube.delete(JOB, "ml", "job-a")
    h.fire_retry()
    assert h.reconciles("ok") == 1
    assert (h.reconciler._locks, h.reconciler._retries, h.reconciler._failures) == ({}, {}, {})
