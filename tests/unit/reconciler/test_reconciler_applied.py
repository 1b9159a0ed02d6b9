"""A pass re-sends a child only when it would change something (applied.py): KubeRay's status writes
while a job starts are each a pass, and each used to re-apply five unchanged children. What still
makes a pass apply: a spec change of the job, a RayJob edited or re-created by someone else, and the
resync pass (which also restores a prerequisite deleted by hand)."""

from __future__ import annotations

import asyncio
from typing import Any

from fake_kube import JOB, RAYJOB, SA, Harness, api_error, one_gpu_job

from rljob_operator.applied import AppliedChildren

KEY = ("ml", "job-a")


def applies(h: Harness, since: int) -> list[str]:
    return [w for w in h.writes()[since:] if w.startswith("apply:")]


def test_an_unchanged_job_is_reconciled_without_applying_anything() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    before = len(h.writes())
    for status in ("Initializing", "Running"):
        h.kube.set_rayjob_status("job-a", jobDeploymentStatus=status, jobStatus="RUNNING")
        h.reconcile("job-a")
    assert applies(h, before) == []
    assert h.status("job-a")["phase"] == "Running"  # the status still follows the RayJob


def test_a_spec_change_re_applies_the_rayjob_and_only_it() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    before = len(h.writes())
    h.kube.put(JOB, "ml", "job-a", {"spec": {"suspend": True}}, manager="kubectl-edit")
    h.reconcile("job-a")
    assert applies(h, before) == ["apply:RayJob"]
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["suspend"] is True


def test_a_rayjob_edited_or_re_created_by_someone_else_is_applied_again() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    before = len(h.writes())
    h.kube.put(RAYJOB, "ml", "job-a", {"spec": {"suspend": True}}, manager="someone")  # generation moves
    h.reconcile("job-a")
    assert applies(h, before) == ["apply:RayJob"]
    before = len(h.writes())
    h.kube.delete(RAYJOB, "ml", "job-a")
    h.reconcile("job-a")
    assert "apply:RayJob" in applies(h, before)
    assert h.kube.get(RAYJOB, "ml", "job-a") is not None


def test_a_prerequisite_deleted_by_hand_comes_back_at_the_resync_pass() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    h.kube.delete(SA, "ml", "job-a-runtime")
    h.reconcile("job-a")
    assert h.kube.get(SA, "ml", "job-a-runtime") is None  # never read back: trusted until the resync
    h.reconciler.reapply_all()
    h.reconcile("job-a")
    assert h.kube.get(SA, "ml", "job-a-runtime") is not None


def test_a_deleted_job_leaves_no_memory_of_its_children() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    assert h.reconciler.metrics.keys() == {KEY}
    h.kube.delete(JOB, "ml", "job-a")
    h.reconcile("job-a")
    assert h.reconciler.metrics.keys() == {KEY}  # its RayJob's watch event has not arrived yet
    h.settle()  # it arrives (and garbage collection's deletion of it)
    assert h.reconciler.metrics.keys() == set()
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 0


def test_applied_children_compare_body_uid_and_generation() -> None:
    memo = AppliedChildren()
    slot = ("RayJob", "job-a", "rljob-operator")
    body = {"spec": {"suspend": False}}
    result = {"metadata": {"uid": "u1", "generation": 3}}
    assert not memo.unchanged(KEY, slot, body, result, read=True)  # never applied
    memo.record(KEY, slot, body, result)
    assert memo.unchanged(KEY, slot, {"spec": {"suspend": False}}, result, read=True)
    assert not memo.unchanged(KEY, slot, {"spec": {"suspend": True}}, result, read=True)
    assert not memo.unchanged(KEY, slot, body, {"metadata": {"uid": "u1", "generation": 4}}, read=True)
    assert not memo.unchanged(KEY, slot, body, {"metadata": {"uid": "u2", "generation": 3}}, read=True)
    assert not memo.unchanged(KEY, slot, body, None, read=True)  # gone since
    assert memo.unchanged(KEY, slot, body, None, read=False)  # a prerequisite: not read
    memo.forget_all()
    assert not memo.unchanged(KEY, slot, body, result, read=False) and memo.jobs() == set()


def test_a_job_deleted_mid_pass_is_forgotten_without_a_retry() -> None:
    h = one_gpu_job()

    def deleted_now(*_: object) -> bool:  # the job goes while its first status write is on the way
        h.kube.delete(JOB, "ml", "job-a")
        return True

    h.kube.fail(
        "apply_job_status", api_error(404, "NotFound", 'rltrainingjobs "job-a" not found'), when=deleted_now
    )
    h.reconcile("job-a")
    assert (h.reconciles("error"), h.timers) == (0, [])
    assert h.reconciler.metrics.keys() == set()


def test_events_during_a_pass_fold_into_one_waiting_pass() -> None:
    """Five events of one job while its pass runs: one more pass after it, not five."""
    h = one_gpu_job()
    get_job = h.kube.get_job

    async def slow_get_job(namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # the pass yields here, as a real GET does
        return await get_job(namespace, name)

    h.kube.get_job = slow_get_job  # type: ignore[method-assign]

    async def burst() -> None:
        await asyncio.gather(*(h.reconciler.reconcile("ml", "job-a") for _ in range(6)))

    h._run(burst)
    assert h.reconciles("ok") == 2
    assert len(h.kube.calls_to("get_job")) == 2
