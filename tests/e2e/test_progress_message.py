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


def test_the_message_comes_and_goes_without_touching_the_step(
    crd: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(crd.kubeconfig))
    crd.apply(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "msg", "namespace": namespace},
            "spec": BASE_SPEC,
        }
    )
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
