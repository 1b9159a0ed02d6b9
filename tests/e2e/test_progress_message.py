"""The runtime's status.progress.message on the real API server: a download line before the first
step, posted without removing a resumed run's step fields, and gone once a step is reported."""

from __future__ import annotations

import io
from typing import Any

import pytest

from rljob_api.resource import API_VERSION, KIND
from rljob_runtime.report import JobIdentity, ProgressReporter

from spec_cases import BASE_SPEC

pytestmark = pytest.mark.e2e


def _apply_job(crd: Any, name: str, namespace: str) -> None:
    crd.apply(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": BASE_SPEC,
        }
    )


def test_the_message_comes_and_goes_without_touching_the_step(
    crd: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(crd.kubeconfig))
    _apply_job(crd, "msg", namespace)
    job = JobIdentity("msg", namespace)

    def progress() -> dict[str, Any]:
        return (crd.get("rljob", "msg", namespace) or {}).get("status", {}).get("progress", {})

    first = ProgressReporter(10, job=job, tensorboard_dir=None, stream=io.StringIO())
    first.step(3, {"reward/mean": 0.5})
    assert progress()["step"] == 3 and "message" not in progress()
    # A restarted runtime downloads again before its first step: the old step stays visible.
    resumed = ProgressReporter(10, job=job, tensorboard_dir=None, stream=io.StringIO())
    resumed.message("downloading Org/Tiny@main: 1.0/2.0 GB (50%)")
    assert progress()["message"] == "downloading Org/Tiny@main: 1.0/2.0 GB (50%)"
    assert progress()["step"] == 3 and progress()["rewardMean"] == 0.5
    resumed.step(4, {"reward/mean": 0.6})
    assert "message" not in progress() and progress()["step"] == 4 and progress()["updatedAt"]


def test_a_trainer_restart_shows_in_status_and_events(
    crd: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(crd.kubeconfig))
    _apply_job(crd, "restarts", namespace)
    uid = crd.get("rljob", "restarts", namespace)["metadata"]["uid"]
    reporter = ProgressReporter(
        10, job=JobIdentity("restarts", namespace, uid), tensorboard_dir=None, stream=io.StringIO()
    )
    reporter.step(4, {"reward/mean": 0.5})
    line = "trainer restart 1 of 2: trainer rank 1 lost at step 5 (killed); going on from step 4"
    reporter.trainer_restarted(1, line)

    def progress() -> dict[str, Any]:
        return (crd.get("rljob", "restarts", namespace) or {}).get("status", {}).get("progress", {})

    assert progress()["trainerRestarts"] == 1 and progress()["lastTrainerRestart"] == line
    assert progress()["step"] == 4  # the step fields stay
    reporter.step(5, {"reward/mean": 0.6})  # a step's report keeps the restart fields
    assert progress()["step"] == 5 and progress()["trainerRestarts"] == 1
    events = [
        e
        for e in crd.list("event", namespace)
        if e["involvedObject"].get("uid") == uid and e["reason"] == "TrainerRestarted"
    ]
    assert len(events) == 1 and events[0]["type"] == "Warning" and events[0]["message"] == line
    described = crd.kubectl("describe", "rljob", "restarts", "-n", namespace).stdout
    assert "TrainerRestarted" in described
