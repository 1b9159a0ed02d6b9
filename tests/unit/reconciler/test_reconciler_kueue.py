"""The Kueue gate: a job with spec.queueName (with --kueue-manage-jobs-without-queue-name, every
job) gets its RayJob created suspended under a field manager of its own, and the operator never
writes spec.suspend again, so Kueue's admissions and preemptions stand."""

from __future__ import annotations

from typing import Any

from fake_kube import RAYJOB, Harness, server_error

from rljob_api.contract import OPERATOR_FIELD_MANAGER
from rljob_operator.build import BuildSettings
from rljob_operator.names import KUEUE_GATE_MANAGER, KUEUE_QUEUE_LABEL


def _rayjob_applies(h: Harness) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c.kwargs["manager"], c.args[0]) for c in h.kube.calls_to("apply") if c.args[0]["kind"] == "RayJob"
    ]


def _operators_rayjob(obj: dict[str, Any], *, manager: str, **_: Any) -> bool:
    return obj["kind"] == "RayJob" and manager == OPERATOR_FIELD_MANAGER


def _suspend(h: Harness) -> bool:
    return (h.kube.get(RAYJOB, "ml", "job-k") or {})["spec"]["suspend"]


def test_a_kueue_job_waits_suspended_and_starts_when_kueue_admits_it() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.set_quota(hard=4)  # Kueue, not the operator, does the accounting for queued jobs
    h.kube.create_job("job-k", {"queueName": "team-a"})
    h.reconcile("job-k")
    (gate_manager, gate), *operator = _rayjob_applies(h)
    assert (gate_manager, gate["spec"]["suspend"]) == (KUEUE_GATE_MANAGER, True)
    assert gate["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert [(m, "suspend" in obj["spec"]) for m, obj in operator] == [(OPERATOR_FIELD_MANAGER, False)]
    assert _suspend(h) is True
    assert (h.status("job-k")["phase"], h.condition("job-k", "Ready")["reason"]) == (
        "Queued",
        "WaitingForKueue",
    )
    assert h.kube.calls_to("list_quotas") == []
    writes = len(h.kube.calls_to("apply_job_status"))
    h.reconcile("job-k")  # still waiting: nothing to write
    assert len(h.kube.calls_to("apply_job_status")) == writes

    h.kube.kueue_set_suspend("job-k", False)  # Kueue admits
    h.reconcile("job-k")
    assert _suspend(h) is False
    assert h.status("job-k")["phase"] == "Starting"

    h.kube.kueue_set_suspend("job-k", True)  # Kueue preempts
    h.reconcile("job-k")
    assert _suspend(h) is True
    assert h.status("job-k")["phase"] == "Queued"
    managers = [m for m, _ in _rayjob_applies(h)]
    assert managers.count(KUEUE_GATE_MANAGER) == 1  # only at creation
    assert not any("suspend" in obj["spec"] for m, obj in _rayjob_applies(h) if m != KUEUE_GATE_MANAGER)


def test_a_kueue_rayjob_created_by_the_gate_is_announced_when_the_next_apply_failed() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-k", {"queueName": "team-a"})
    h.kube.fail("apply", server_error(), when=_operators_rayjob)
    h.reconcile("job-k")
    h.fire_retry()
    assert h.status("job-k")["phase"] == "Queued"
    assert "Created" in [reason for _, reason, _ in h.events]


def test_with_kueue_managing_jobs_without_a_queue_name_the_operator_leaves_every_job_to_it() -> None:
    """--kueue-manage-jobs-without-queue-name: a job without spec.queueName gets the same gate (no
    GPU-quota queue, spec.suspend written once, at creation), and waits for Kueue, not for nothing."""
    h = Harness(BuildSettings(kueue_manage_jobs_without_queue_name=True))
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.set_quota(hard=4)  # would queue it (8 GPUs) if the operator still did the accounting
    h.kube.create_job("job-k", {})
    h.reconcile("job-k")
    (gate_manager, gate), *operator = _rayjob_applies(h)
    assert (gate_manager, gate["spec"]["suspend"]) == (KUEUE_GATE_MANAGER, True)
    assert KUEUE_QUEUE_LABEL not in gate["metadata"]["labels"]
    assert [(m, "suspend" in obj["spec"]) for m, obj in operator] == [(OPERATOR_FIELD_MANAGER, False)]
    assert h.kube.calls_to("list_quotas") == []
    ready = h.condition("job-k", "Ready")
    assert (h.status("job-k")["phase"], ready["reason"]) == ("Queued", "WaitingForKueue")
    assert "no LocalQueue" in ready["message"] and "queue" not in h.status("job-k")

    # Kueue's webhook put it in the namespace's "default" LocalQueue: the status names it.
    h.kube.put(
        RAYJOB, "ml", "job-k", {"metadata": {"labels": {KUEUE_QUEUE_LABEL: "default"}}}, manager="kueue"
    )
    h.reconcile("job-k")
    assert h.status("job-k")["queue"] == "default"
    assert "LocalQueue 'default'" in h.condition("job-k", "Ready")["message"]

    h.kube.kueue_set_suspend("job-k", False)  # Kueue admits
    h.reconcile("job-k")
    h.reconcile("job-k")
    assert _suspend(h) is False and h.status("job-k")["phase"] == "Starting"
    h.kube.kueue_set_suspend("job-k", True)  # Kueue preempts
    h.reconcile("job-k")
    assert _suspend(h) is True and h.status("job-k")["phase"] == "Queued"
    assert [m for m, _ in _rayjob_applies(h)].count(KUEUE_GATE_MANAGER) == 1
    assert not any("suspend" in obj["spec"] for m, obj in _rayjob_applies(h) if m != KUEUE_GATE_MANAGER)
    assert h.kube.calls_to("list_quotas") == []


def test_with_kueue_managing_jobs_without_a_queue_name_spec_suspend_still_suspends() -> None:
    h = Harness(BuildSettings(kueue_manage_jobs_without_queue_name=True))
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-k", {"suspend": True})
    h.reconcile("job-k")
    assert h.kube.get(RAYJOB, "ml", "job-k") is None and h.status("job-k")["phase"] == "Suspended"
