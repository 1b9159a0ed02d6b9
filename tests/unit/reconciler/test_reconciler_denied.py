"""A permission the operator lacks is named on the job (Stalled condition and a Warning event)
while the phase stays, and cleared by the first pass after the permission is granted."""

from __future__ import annotations

from typing import Any

from fake_kube import OPERATOR_USER, Harness, forbidden, one_gpu_job

DENIED = "patch rayjobs.ray.io in namespace ml"


def _rayjob(obj: dict[str, Any], *_: Any, **__: Any) -> bool:
    return obj["kind"] == "RayJob"


def _stalled(h: Harness) -> tuple[str, str, str]:
    stalled = h.condition("job-a", "Stalled")
    return stalled["status"], stalled["reason"], stalled["message"]


def test_a_403_on_the_rayjob_names_the_missing_permission_until_it_is_granted() -> None:
    h = one_gpu_job()
    h.kube.fail("apply", forbidden("patch", "rayjobs", "ray.io", "ml", "job-a"), times=None, when=_rayjob)
    h.reconcile("job-a")
    status, reason, message = _stalled(h)
    assert (h.status("job-a")["phase"], status, reason) == ("Pending", "True", "PermissionDenied")
    assert DENIED in message and OPERATOR_USER in message
    assert ("Warning", "PermissionDenied", message) in h.events
    assert h.reconciles("error") == 1 and len(h.timers) == 1
    writes = len(h.kube.calls_to("apply_job_status"))
    h.fire_retry()  # still refused: the same condition is not written again
    assert len(h.kube.calls_to("apply_job_status")) == writes
    h.kube.heal()  # `helm upgrade` restores the rule
    h.fire_retry()
    assert h.status("job-a")["phase"] == "Starting"
    assert _stalled(h)[:2] == ("False", "NotStalled")
    assert h.condition("job-a", "Ready")["reason"] == "Starting"


def test_a_403_on_a_running_job_keeps_it_running() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    h.kube.fail("apply", forbidden("patch", "rayjobs", "ray.io", "ml", "job-a"), when=_rayjob)
    h.reconciler.reapply_all()  # the resync pass applies the unchanged RayJob again
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Running"
    assert _stalled(h)[:2] == ("True", "PermissionDenied")
    assert h.condition("job-a", "Ready")["status"] == "True"
    h.fire_retry()
    assert _stalled(h)[:2] == ("False", "NotStalled")
