"""A child the API server refuses (KubeRay's CRD schema, a webhook, a kind not served) makes the job
Stalled with the API server's whole message and one Warning event, not a silent retry loop; the
first pass after the cause is fixed clears it."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import RAYJOB, Harness, api_error, one_gpu_job

INVALID = (
    'RayJob.ray.io "job-a" is invalid: spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0]'
    '.resources.limits: Invalid value: "8x": quantities must match the regular expression'
)
WEBHOOK = (
    'admission webhook "policy.example.com" denied the request: images must come from registry.example.com'
)
NOT_SERVED = "the server could not find the requested resource"


def _rayjob(obj: dict[str, Any], *_: Any, **__: Any) -> bool:
    return obj["kind"] == "RayJob"


def _stalled(h: Harness) -> tuple[str, str, str]:
    stalled = h.condition("job-a", "Stalled")
    return stalled["status"], stalled["reason"], stalled["message"]


@pytest.mark.parametrize(
    ("status", "reason", "said", "advice"),
    [
        (422, "Invalid", INVALID, "Change the field it names"),
        (400, "BadRequest", WEBHOOK, "A webhook refused it"),
        (404, "NotFound", NOT_SERVED, "The API server does not serve this kind: install KubeRay"),
    ],
    ids=["crd-schema", "webhook", "not-served"],
)
def test_a_refused_rayjob_stalls_the_job_with_the_whole_message(
    status: int, reason: str, said: str, advice: str
) -> None:
    h = one_gpu_job()
    h.kube.fail("apply", api_error(status, reason, said), times=None, when=_rayjob)
    h.reconcile("job-a")
    state, why, message = _stalled(h)
    assert (h.status("job-a")["phase"], state, why) == ("Pending", "True", "ApplyRefused")
    assert message.startswith(
        f"the API server refused to apply RayJob job-a ({status} {reason}): {said}. {advice}"
    )
    assert h.condition("job-a", "Ready")["message"] == message  # the -o wide column
    assert h.condition("job-a", "Reconciling")["status"] == "False"
    assert h.events[-1] == ("Warning", "ApplyRefused", message)
    writes, events = len(h.kube.calls_to("apply_job_status")), len(h.events)
    h.fire_retry()
    h.fire_retry()  # refused again: retried (cheaply), but said only once
    assert (len(h.kube.calls_to("apply_job_status")), len(h.events)) == (writes, events)
    assert [t.delay for t in h.timers] == [1, 2, 5]
    h.kube.heal()  # the spec, the policy or KubeRay was fixed
    h.fire_retry()
    assert h.status("job-a")["phase"] == "Starting" and _stalled(h)[:2] == ("False", "NotStalled")
    assert h.kube.get(RAYJOB, "ml", "job-a") is not None


def test_a_refused_update_of_a_running_job_keeps_it_running_and_stalled() -> None:
    h = one_gpu_job()
    h.reconcile("job-a")
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    h.kube.fail("apply", api_error(422, "Invalid", INVALID), when=_rayjob)
    h.reconciler.reapply_all()  # the resync pass applies the unchanged RayJob again
    h.reconcile("job-a")
    assert h.status("job-a")["phase"] == "Running" and h.condition("job-a", "Ready")["status"] == "True"
    assert _stalled(h)[:2] == ("True", "ApplyRefused")
    assert h.condition("job-a", "Ready")["reason"] == "Running"  # the column keeps the step
