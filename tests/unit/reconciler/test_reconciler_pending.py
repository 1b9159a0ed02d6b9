"""A new job is Pending (status and event) before its RayJob is created, so watchers see it accepted
even when creating it fails. The status write goes at once with the runtime's ServiceAccount, Role,
RoleBinding and NetworkPolicy (they run nothing): a new job's first pass waits on two round trips
to the API server before its RayJob, not four."""

from __future__ import annotations

from fake_kube import BINDING, JOB, RAYJOB, SA, one_gpu_job, server_error

# The RoleBinding after its Role (the rest of the prerequisites go with the Role), the RayJob last.
CHILDREN = ["apply:ServiceAccount", "apply:Role", "apply:NetworkPolicy", "apply:RoleBinding", "apply:RayJob"]


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
    assert "suspend" not in rayjob["spec"]  # false, left out as KubeRay writes it
    assert h.status("job-a")["children"] == {"serviceAccount": "job-a-runtime", "rayJob": "job-a"}


def test_when_the_pending_write_fails_no_rayjob_is_created() -> None:
    h = one_gpu_job()
    h.kube.fail("apply_job_status", server_error())
    h.reconcile("job-a")
    assert h.writes() == ["status:Pending", *CHILDREN[:-1]]  # refused; the prerequisites went with it
    assert h.kube.get(RAYJOB, "ml", "job-a") is None
    h.fire_retry()
    assert h.writes()[5:] == [
        "status:Pending",
        "event:Creating",
        "apply:RayJob",  # the prerequisites were applied: not sent again
        "event:Created",
        "status:Starting",
        "event:Starting",
    ]
