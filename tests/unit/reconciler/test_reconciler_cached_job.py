"""A pass reads its job from the watch cache (kopf's index, updated before the handlers run) instead
of the API server, except while the watch event of the operator's own last status write has not
arrived: the cache may then show the job from before that write, and a pass working from it would
announce a phase change a second time."""

from __future__ import annotations

import pytest
from fake_kube import JOB, RAYJOB, Harness, one_gpu_job

from rljob_operator.own_writes import OwnWrites


def _gets(h: Harness) -> int:
    return len(h.kube.calls_to("get_job"))


def _running_written_not_seen() -> Harness:
    """job-a Starting with every event delivered, then a pass that writes Running whose events are not."""
    h = one_gpu_job()
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.settle(only=RAYJOB)  # KubeRay's write arrives and runs a pass; that pass's own write does not
    assert h.status("job-a")["phase"] == "Running"
    return h


def test_passes_on_events_read_the_job_from_the_cache() -> None:
    h = one_gpu_job()
    h.settle()
    gets = _gets(h)
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    assert h.settle() == 1
    assert h.status("job-a")["phase"] == "Running"
    assert _gets(h) == gets  # the job came from the cache


def test_until_our_writes_event_arrives_a_pass_reads_the_api_server() -> None:
    h = _running_written_not_seen()
    events, gets = list(h.events), _gets(h)
    h.reconcile("job-a")  # a pod's event, say: the cache still shows the job Starting
    assert _gets(h) == gets + 1
    assert h.events == events  # nothing announced twice
    h.settle()  # the events arrive, ours last (the RayJob's pass before it still reads the API server)
    gets = _gets(h)
    h.reconcile("job-a")
    assert _gets(h) == gets  # the cache again
    assert h.events == events


def test_without_that_guard_the_stale_cache_announces_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OwnWrites, "job_written", lambda *_: None)  # never waits for our write's event
    h = one_gpu_job()
    h.settle()
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.settle(only=RAYJOB)
    announced = [reason for _, reason, _ in h.events].count("Running")
    h.reconcile("job-a")
    assert [reason for _, reason, _ in h.events].count("Running") == announced + 1


def test_a_job_the_cache_does_not_have_is_gone_without_a_read() -> None:
    """Garbage collection deleting a deleted job's pods and RayJob makes an event each; their passes
    used to GET the job (404) one by one: thousands when many jobs go at once."""
    h = one_gpu_job()
    h.settle()
    h.kube.add_pod("job-a", "job-a-head", role="head", phase="Running")
    h.settle()
    h.kube.delete(JOB, "ml", "job-a")  # with its RayJob and pods
    gets = _gets(h)
    h.settle()
    assert _gets(h) == gets
    assert h.reconciler.metrics.keys() == set()
