"""A new job is Pending (status and event) before any of its children is created, so watchers see
it accepted even when creating them fails."""

from __future__ import annotations

from fake_kube import BINDING, JOB, RAYJOB, SA, one_gpu_job, server_error

CHILDREN = ["apply:ServiceAccount", "apply:Role", "apply:RoleBinding", "apply:NetworkPolicy", "apply:RayJob"]


def test_the_first_pass_writes_pending_then_the_runtime_identity_then_the_rayjob() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    assert h.writes() == [
        "status:Pending",
        "event:Creating",
        *CHILDREN,
        "event:Created",
        "status:Starting",
        "event:Starting",
    ]
    assert h.events[0] == (
        "Normal",
        "Creating",
        "New -> Pending: creating the RayJob and the runtime's ServiceAccount",
    )
    job = h.kube.get(JOB, "ml", "job-a") or {}
    for kind in (SA, BINDING):
        child = h.kube.get(kind, "ml", "job-a-runtime") or {}
        assert child["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    rayjob = h.kube.get(RAYJOB, "ml", "job-a") or {}
    assert rayjob["spec"]["suspend"] is False
    assert h.status("job-a")["children"] == {"serviceAccount": "job-a-runtime", "rayJob": "job-a"}


def test_when_the_pending_write_fails_no_child_is_created() -> None:
    h = one_gpu_job()
    h.kube.fail("apply_job_status", server_error())
    h.reconcile("job-a")
    assert h.writes() == ["status:Pending"]  # tried, refused
    assert h.kube.calls_to("apply") == []
    assert h.kube.get(SA, "ml", "job-a-runtime") is None and h.kube.get(RAYJOB, "ml", "job-a") is None
    h.fire_retry()
    assert h.writes()[1:] == [
        "status:Pending",
        "event:Creating",
        *CHILDREN,
        "event:Created",
        "status:Starting",
        "event:Starting",
    ]
