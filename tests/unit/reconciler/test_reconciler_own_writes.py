"""The watch event of the operator's own status write starts no pass (reconcile.py, _write_status):
the job it shows is the one the pass that wrote it saw, plus that pass's status. Driven through
handlers.py by the FakeKube's watch log (Harness.settle), and compared with the same scenario where
every job event runs a pass: the same writes, in the same order, with fewer passes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from fake_kube import JOB, RAYJOB, Harness, one_gpu_job

from rljob_operator.own_writes import OwnWrites

KILLED = (
    "Job entrypoint command failed with exit code 137, last available logs (truncated to 20,000 chars):\n"
    "step 3/10: reward 0.41\n"
)


def _starts_and_succeeds(h: Harness) -> None:
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Initializing", jobStatus="")
    h.settle()
    h.kube.add_pod("job-a", "job-a-head", role="head", waiting={"reason": "ContainerCreating"})
    h.settle()
    h.kube.add_pod("job-a", "job-a-head", role="head", phase="Running")
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.settle()
    for step in (1, 2, 3):
        h.kube.report_progress("job-a", {"step": step, "stepText": f"{step}/3", "numRollout": 3})
        h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    h.settle()


def _restarts_once(h: Harness) -> None:
    # job-a as one_gpu_job created it, with a restart allowed (its first event shows this spec).
    h.kube.watch.clear()
    h.kube.create_job("job-a", {"faultTolerance": {"backoffLimit": 1}})
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.settle()
    h.kube.set_rayjob_status(
        "job-a", jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed", message=KILLED
    )
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.settle()


def _queued_then_admitted(h: Harness) -> None:
    h.kube.set_quota(hard=8)
    h.kube.create_job("job-b")
    h.settle()
    h.kube.add_pod("job-a", "job-a-worker", gpus=8, phase="Running")
    h.kube.set_quota(hard=8, used=8)
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
    h.kube.add_pod("job-a", "job-a-worker", gpus=8, phase="Succeeded")
    h.kube.set_quota(hard=8, used=0)
    h.settle()


def _suspended_and_resumed(h: Harness) -> None:
    h.settle()
    for suspend in (True, False):
        h.kube.put(JOB, "ml", "job-a", {"spec": {"suspend": suspend}}, manager="kubectl-edit")
        h.settle()


SCENARIOS: dict[str, Callable[[Harness], None]] = {
    "starts and succeeds": _starts_and_succeeds,
    "restarts once": _restarts_once,
    "queued then admitted": _queued_then_admitted,
    "suspended and resumed": _suspended_and_resumed,
}


def _run(scenario: Callable[[Harness], None]) -> Harness:
    h = one_gpu_job()
    scenario(h)
    return h


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_skipping_the_events_of_our_own_writes_changes_no_write(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each status write used to cost a pass of its own, which wrote nothing: now it costs none."""
    after = _run(SCENARIOS[name])
    with monkeypatch.context() as m:
        m.setattr(OwnWrites, "echo", lambda *_: False)  # before: every job event runs a pass
        before = _run(SCENARIOS[name])
    assert after.writes() == before.writes()
    status_writes = sum(1 for w in after.writes() if w.startswith("status:"))
    rayjob_applies = after.writes().count("apply:RayJob")  # its event shows what the pass saw: skipped too
    assert status_writes > 0 and rayjob_applies > 0
    assert after.passes() == before.passes() - status_writes - rayjob_applies
    # A pass that runs anyway (the resync's) finds nothing left to do.
    done = len(after.writes())
    for job in ("job-a", "job-b"):
        after.reconcile(job)
    assert after.writes()[done:] == []


def test_a_job_that_starts_and_succeeds_takes_nine_passes_not_seventeen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    after = _run(_starts_and_succeeds)
    monkeypatch.setattr(OwnWrites, "echo", lambda *_: False)
    before = _run(_starts_and_succeeds)
    assert (before.passes(), after.passes()) == (17, 9)  # 7 status writes and the RayJob's creation
    assert after.status("job-a")["phase"] == "Succeeded"


def _meanwhile(h: Harness, act: Callable[[], None]) -> None:
    """Run `act` (someone else's write of the job) just before the operator's next status write
    reaches the API server, with its watch event lost (a watch re-listed after an error shows only
    the latest version): only the event of the operator's write, which shows both, arrives."""
    write = h.kube.apply_job_status

    async def late(namespace: str, name: str, status: Any) -> dict[str, Any]:
        h.kube.apply_job_status = write  # type: ignore[method-assign]
        act()
        h.kube.watch.pop()
        return await write(namespace, name, status)

    h.kube.apply_job_status = late  # type: ignore[method-assign]


def test_a_progress_report_hidden_behind_our_write_still_runs_a_pass() -> None:
    h = one_gpu_job()
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    _meanwhile(h, lambda: h.kube.report_progress("job-a", {"step": 7, "stepText": "7/10", "numRollout": 10}))
    assert h.settle() == 2  # the RayJob's event, then our write's (it shows the runtime's step too)
    assert h.registry.get_sample_value("rljob_job_step", {"namespace": "ml", "name": "job-a"}) == 7
    ready = h.condition("job-a", "Ready")
    assert ready["message"].startswith("step 7/10")


def test_a_spec_edit_hidden_behind_our_write_still_runs_a_pass() -> None:
    h = one_gpu_job()
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    _meanwhile(h, lambda: h.kube.put(JOB, "ml", "job-a", {"spec": {"suspend": True}}, manager="kubectl-edit"))
    assert h.settle() == 2  # the RayJob's event, then our write's (that of the RayJob it suspended: ours)
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["suspend"] is True
    assert h.status("job-a")["phase"] == "Suspended"


def test_our_writes_event_arriving_before_its_answer_is_skipped_as_well() -> None:
    """The watch may deliver the event before the patch's response: it waits for the pass that wrote,
    then finds the version recorded."""
    h = one_gpu_job()
    write = h.kube.apply_job_status
    early: list[asyncio.Task[None]] = []

    async def answer_late(namespace: str, name: str, status: Any) -> dict[str, Any]:
        written = await write(namespace, name, status)
        version = written["metadata"]["resourceVersion"]
        early.append(asyncio.create_task(h.reconciler.reconcile(namespace, name, version)))
        await asyncio.sleep(0)  # that event is handled first: it waits for this pass's lock
        return written

    h.kube.apply_job_status = answer_late  # type: ignore[method-assign]

    async def first_pass() -> None:
        await h.reconciler.reconcile("ml", "job-a")
        await asyncio.gather(*early)

    h._run(first_pass)
    assert len(early) == 2  # Pending, then Starting
    assert h.passes() == 1


def test_events_of_other_causes_and_the_resync_always_run_a_pass() -> None:
    h = one_gpu_job()
    h.settle()
    job = h.kube.get(JOB, "ml", "job-a") or {}
    passes = h.passes()
    h._run(lambda: h.reconciler.reconcile("ml", "job-a", job["metadata"]["resourceVersion"]))
    assert h.passes() == passes  # the job as our last write left it
    h.reconcile("job-a")  # no version: the resync, a retry, an event of its RayJob or pods
    assert h.passes() == passes + 1


def test_a_deleted_job_leaves_no_record_of_our_writes() -> None:
    h = one_gpu_job()
    h.settle()
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 1
    h.kube.delete(JOB, "ml", "job-a")
    h.settle()
    assert h.registry.get_sample_value("rljob_operator_tracked_jobs") == 0
