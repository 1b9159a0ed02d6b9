"""A pass reads its job's RayJob from the watch cache (kopf's index of RayJobs, updated before the
handlers run) instead of the API server, except while a RayJob the operator applied (or deleted) has
not come back through the watch: a RayJob just created is not in the index yet, and a pass taking the
index's word would create it again, or, for a job deleted and created again at once, take over the
old job's RayJob. Each pass used to GET the RayJob: about five GETs per job while it starts."""

from __future__ import annotations

import asyncio
import time

from fake_kube import JOB, RAYJOB, Harness, WatchEvent, one_gpu_job

from rljob_operator.own_writes import UNSEEN_RAYJOB_SECONDS


def _gets(h: Harness) -> int:
    return len(h.kube.calls_to("get_rayjob"))


def _started() -> Harness:
    h = one_gpu_job()
    h.settle()  # the caches handed over, every event delivered
    assert h.status("job-a")["phase"] == "Starting"
    return h


def test_passes_read_the_rayjob_from_the_cache() -> None:
    h = _started()
    gets = _gets(h)
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.kube.add_pod("job-a", "job-a-head", role="head", phase="Running")
    assert h.settle() >= 1
    assert h.status("job-a")["phase"] == "Running"
    assert _gets(h) == gets


def test_a_new_job_with_the_caches_ready_makes_no_read_before_its_rayjob() -> None:
    h = _started()
    h.kube.create_job("job-b")
    gets = _gets(h)
    h.settle()
    assert h.kube.get(RAYJOB, "ml", "job-b") is not None
    assert _gets(h) == gets


def test_until_the_rayjobs_event_arrives_a_pass_reads_the_api_server() -> None:
    h = one_gpu_job()
    h.settle(only=JOB)  # job-a's first pass: the caches handed over, its RayJob's event still on its way
    assert h.kube.get(RAYJOB, "ml", "job-a") is not None
    assert h.kube.cached_rayjob("ml", "job-a") == (True, None)
    gets, applies = _gets(h), len(h.kube.calls_to("apply"))
    h.reconcile("job-a")  # a pod's event, say
    assert _gets(h) == gets + 1  # not taken from the index, which says there is none
    assert len(h.kube.calls_to("apply")) == applies  # so nothing applied again
    h.settle()
    gets = _gets(h)
    h.reconcile("job-a")
    assert _gets(h) == gets  # the index has it now


def test_a_job_deleted_and_created_at_once_does_not_take_the_old_rayjob_from_a_stale_cache() -> None:
    """The old job's RayJob applied, its event not in the index yet, the job deleted (garbage
    collection not done) and created again: the new job's pass must see the old RayJob."""
    h = one_gpu_job()
    h.settle(only=JOB)
    old = h.kube.get(RAYJOB, "ml", "job-a") or {}
    h.kube.store.pop((JOB, "ml", "job-a"))  # deleted; its RayJob left for garbage collection
    h.reconcile("job-a")  # the deletion's pass: the operator forgets the job
    h.kube.create_job("job-a")
    h.settle(only=JOB)  # the new job's events; the RayJob's still on its way
    rayjob = h.kube.get(RAYJOB, "ml", "job-a") or {}
    assert rayjob["metadata"]["uid"] == old["metadata"]["uid"]
    assert rayjob["metadata"]["ownerReferences"] == old["metadata"]["ownerReferences"]  # not taken over
    assert h.condition("job-a", "Ready")["message"] == (
        "waiting for RayJob job-a of an earlier job of this name to be deleted"
    )


def test_the_event_of_a_rayjob_deleted_for_a_restart_does_not_vouch_for_its_successor() -> None:
    h = one_gpu_job()
    h.kube.watch.clear()
    h.kube.create_job("job-a", {"faultTolerance": {"backoffLimit": 1}})
    h.settle()
    old = (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"]
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed")
    h.deliver_next(RAYJOB)  # the failure's pass: the RayJob deleted and created again
    new = (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"]
    assert new != old
    gets, applies = _gets(h), len(h.kube.calls_to("apply"))
    h.deliver_next(RAYJOB)  # the old one's deletion (and its pass): the index has no RayJob job-a now
    assert h.kube.cached_rayjob("ml", "job-a") == (True, None)
    assert _gets(h) == gets + 1  # the new one's event is still on its way: read
    assert len(h.kube.calls_to("apply")) == applies  # not applied again as if missing
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"] == new


def test_the_pending_status_and_the_prerequisites_go_at_once_and_the_rayjob_after_both() -> None:
    h = one_gpu_job()
    release = asyncio.Event()
    write_status = h.kube.apply_job_status
    seen: list[str] = []

    async def slow_status(namespace: str, name: str, status: dict[str, object]) -> dict[str, object]:
        seen.append(f"status:{status.get('phase')} sent")
        await release.wait()
        return await write_status(namespace, name, status)

    h.kube.apply_job_status = slow_status  # type: ignore[method-assign,assignment]

    async def run() -> None:
        task = asyncio.get_running_loop().create_task(h.reconciler.reconcile("ml", "job-a"))
        for _ in range(10):
            await asyncio.sleep(0)
        applied = [c.args[0]["kind"] for c in h.kube.calls_to("apply")]
        assert seen == ["status:Pending sent"]
        # Meanwhile; the RoleBinding once its Role is there (test_reconciler_role_binding.py).
        assert applied == ["ServiceAccount", "Role", "NetworkPolicy", "RoleBinding"]
        release.set()
        await task

    h._run(run)
    assert [c.args[0]["kind"] for c in h.kube.calls_to("apply")][-1] == "RayJob"
    assert h.status("job-a")["phase"] == "Starting"


def test_the_rayjobs_marks_go_with_their_events() -> None:
    """What the operator keeps per RayJob until its event comes (rljob_operator_tracked_jobs)."""
    h = one_gpu_job()
    h.settle(only=JOB)
    h.kube.delete(JOB, "ml", "job-a")  # its RayJob goes by garbage collection
    h.settle(only=JOB)  # the deletion's pass: the job's own state goes, the RayJob's mark stays
    tracked = h.reconciler.metrics.keys()
    assert tracked == {("ml", "job-a")}
    h.settle()  # the RayJob's events (added, deleted)
    assert h.reconciler.metrics.keys() == set()
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 0


def test_a_mark_whose_event_never_comes_goes_at_a_resync_after_a_minute() -> None:
    """A watch that broke and re-listed may never show the event of the operator's write: the pass
    reads that RayJob from the API server until the next resync a minute on, not forever."""
    h = one_gpu_job()
    h.settle(only=JOB)
    own = h.reconciler.own
    assert own.rayjob_behind("ml", "job-a")
    h.reconciler.reapply_all({("ml", "job-a")})
    assert own.rayjob_behind("ml", "job-a")  # just written: kept
    later = time.monotonic() + UNSEEN_RAYJOB_SECONDS + 1
    own._clock = lambda: later
    h.reconciler.reapply_all({("ml", "job-a")})
    assert not own.rayjob_behind("ml", "job-a")
    gets = _gets(h)
    h.reconcile("job-a")
    assert _gets(h) == gets  # the index again


def _running() -> Harness:
    h = _started()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.settle()
    assert h.status("job-a")["phase"] == "Running"
    return h


def test_a_rayjob_deleted_by_hand_after_the_pass_read_it_is_recreated_by_the_apply_and_announced() -> None:
    """`kubectl delete rayjob` lands between the index's answer and the resync pass's apply: the
    server-side apply creates it again. That is a recreation, and it says so (it was once silent)."""
    h = _running()
    old = (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"]
    h.kube.delete(RAYJOB, "ml", "job-a")  # its DELETED event still on its way to the index
    h.reconciler.reapply_all({("ml", "job-a")})  # the resync: every child applied again
    h.reconcile("job-a")
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"] != old
    h.settle()  # the old one's deletion, the new one's creation: nothing more to do
    assert [reason for _, reason, _ in h.events].count("Recreated") == 1


def test_a_rayjob_being_deleted_is_not_applied_to_and_its_successor_comes_once_it_is_gone() -> None:
    """KubeRay's finalizer holds a RayJob deleted by hand while it stops the Ray job: applying to it
    changes nothing, and an apply that lands after it is gone would create the successor unseen."""
    h = _running()
    h.kube.slow_deletes = True
    rayjob = h.kube.get(RAYJOB, "ml", "job-a") or {}
    asyncio.run(h.kube.delete_rayjob("ml", "job-a", rayjob["metadata"]["uid"]))  # by hand, finalizer on
    stored = h.kube.store[(RAYJOB, "ml", "job-a")].obj["metadata"]
    stored["generation"] += 1  # as the API server does when it sets a deletionTimestamp
    h.kube.watch.append(WatchEvent("MODIFIED", RAYJOB, h.kube.get(RAYJOB, "ml", "job-a") or {}))
    applies = len(h.kube.calls_to("apply"))
    h.settle()
    assert len(h.kube.calls_to("apply")) == applies
    h.kube.delete(RAYJOB, "ml", "job-a")  # the finalizer removed
    h.settle()
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["metadata"]["uid"] != rayjob["metadata"]["uid"]
    assert [reason for _, reason, _ in h.events].count("Recreated") == 1
