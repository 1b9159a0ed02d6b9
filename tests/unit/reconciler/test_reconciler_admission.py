"""GPU quota admission through the Reconciler: whole jobs only, strictly in creation order, and a
queued job has no children (no half-created gang holding GPUs)."""

from __future__ import annotations

import pytest
from fake_kube import JOB, POD, RAYJOB, SA, Harness

_NODES_1 = {"resources": {"trainer": {"nodes": 1}}}


_SIXTEEN = {"resources": {"colocate": False, "rollout": {"gpus": 8}}}  # 8 trainer + 8 rollout GPUs


def _queue(*jobs: tuple[str, int], hard: int = 12) -> Harness:
    """Jobs of (name, 8 or 16 GPUs), created 1 s apart in this order, under a GPU quota."""
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.set_quota(hard=hard)
    for name, gpus in jobs:
        h.kube.create_job(name, _SIXTEEN if gpus == 16 else _NODES_1)
    return h


def _has_children(h: Harness, name: str) -> bool:
    return h.kube.get(RAYJOB, "ml", name) is not None or h.kube.get(SA, "ml", f"{name}-runtime") is not None


def _ready(h: Harness, name: str) -> tuple[str, str, str]:
    ready = h.condition(name, "Ready")
    return h.status(name)["phase"], ready["reason"], ready["message"]


@pytest.mark.parametrize("ends", ["finishes", "is deleted"])
def test_two_jobs_that_fit_only_alone_are_admitted_in_creation_order(ends: str) -> None:
    h = _queue(("job-a", 8), ("job-b", 8))
    h.reconcile("job-b")  # reconciled first, created second: job-a keeps its place
    phase, reason, message = _ready(h, "job-b")
    assert (phase, reason) == ("Queued", "InsufficientQuota")
    assert "1 job(s) ahead of it in the queue" in message
    assert not _has_children(h, "job-b")
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Starting"
    assert "suspend" not in (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]  # admitted
    h.reconcile("job-b")  # job-a's 8 GPUs are reserved until its pods exist
    assert "0 in use, 8 reserved by starting jobs" in _ready(h, "job-b")[2]
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, phase="Running")
    h.kube.set_quota(hard=12, used=8)
    h.reconcile("job-b")  # now counted in `used`, not reserved twice
    assert "8 in use, 0 reserved" in _ready(h, "job-b")[2]
    assert not _has_children(h, "job-b")
    if ends == "finishes":
        h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
        h.reconcile("job-a")
        assert h.status("job-a")["phase"] == "Succeeded"
    else:
        h.kube.delete(JOB, "ml", "job-a")
        assert not _has_children(h, "job-a")  # garbage-collected
    h.reconcile("job-b")  # the pods still hold the GPUs
    assert h.status("job-b")["phase"] == "Queued"
    h.kube.delete(POD, "ml", "job-a-gpu-0")
    h.kube.set_quota(hard=12, used=0)
    h.reconcile("job-b")
    assert h.status("job-b")["phase"] == "Starting"
    assert "suspend" not in (h.kube.get(RAYJOB, "ml", "job-b") or {})["spec"]  # admitted


def test_a_job_larger_than_the_quota_is_stalled_and_does_not_block_the_jobs_behind_it() -> None:
    h = _queue(("big", 16), ("small", 8))
    h.reconcile("big")
    stalled = h.condition("big", "Stalled")
    assert (h.status("big")["phase"], stalled["status"], stalled["reason"]) == (
        "Pending",
        "True",
        "QuotaTooSmall",
    )
    assert "needs 16 nvidia.com/gpu but ResourceQuota 'gpus' allows at most 12" in stalled["message"]
    assert h.condition("big", "Queued")["status"] == "False"
    assert ("Warning", "QuotaTooSmall") in [e[:2] for e in h.events]
    h.reconcile("small")  # created after big, admitted before it: big can never fit
    assert h.status("small")["phase"] == "Starting"
    assert not _has_children(h, "big") and _has_children(h, "small")
    h.kube.set_quota(hard=24)  # the administrator raises the quota (small reserves 8 of it)
    h.reconcile("big")
    assert h.status("big")["phase"] == "Starting"
    assert h.condition("big", "Stalled")["status"] == "False"


def test_without_a_gpu_quota_every_job_is_admitted() -> None:
    h = _queue(("job-a", 16), ("job-b", 16))
    h.kube.delete("v1/ResourceQuota", "ml", "gpus")
    for name in ("job-b", "job-a"):
        h.reconcile(name)
        assert h.status(name)["phase"] == "Starting"
    assert h.kube.calls_to("list_jobs", "list_rayjobs") == []  # no quota: nothing else to count


def test_a_job_blocked_by_a_missing_volume_holds_its_place_in_the_quota_queue() -> None:
    # Today a job Pending on a pre-flight blocker still counts as waiting ahead of later jobs.
    h = _queue(hard=12)
    h.kube.create_job("job-x", {"checkpoint": {"volume": {"claimName": "missing"}}, **_NODES_1})
    h.kube.create_job("job-y", _NODES_1)
    h.reconcile("job-x")
    assert (h.status("job-x")["phase"], h.condition("job-x", "Ready")["reason"]) == (
        "Pending",
        "VolumeNotFound",
    )
    h.reconcile("job-y")
    assert (h.status("job-y")["phase"], h.condition("job-y", "Ready")["reason"]) == (
        "Queued",
        "InsufficientQuota",
    )


def test_a_resumed_job_that_does_not_fit_is_queued() -> None:
    h = _queue(("job-a", 8), hard=8)
    h.reconcile("job-a")
    h.kube.create_job("job-a", {"suspend": True})  # kubectl apply again
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Suspended"
    h.kube.create_job("job-b")
    h.reconcile("job-b")
    assert h.status("job-b")["phase"] == "Starting"  # took the GPUs job-a freed
    h.kube.create_job("job-a", {"suspend": False})
    h.reconcile("job-a")
    assert (h.kube.get(RAYJOB, "ml", "job-a") or {})["spec"]["suspend"] is True  # correctly held back
    assert (h.status("job-a")["phase"], h.condition("job-a", "Ready")["reason"]) == (
        "Queued",
        "InsufficientQuota",
    )
    assert h.condition("job-a", "Queued")["message"].startswith(
        "resuming once admitted: needs 8 nvidia.com/gpu"
    )
