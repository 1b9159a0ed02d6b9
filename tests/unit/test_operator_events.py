"""Events are posted by the operator's own client from any context: kopf's poster needs a kopf
handler's context and failed with LookupError for transitions found by the resync or a retry."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from rljob_operator import handlers
from rljob_operator.kube import Kube

JOB = {
    "apiVersion": "rljob.dev/v1alpha1",
    "kind": "RLTrainingJob",
    "metadata": {"name": "job-a", "namespace": "ml", "uid": "u-1"},
}


class RecordingKube(Kube):
    """Kube with its client calls recorded instead of sent (the client method, its arguments)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail

        async def create_namespaced_event(*_: Any, **__: Any) -> Any:  # never called: _call records
            raise AssertionError

        self.core = SimpleNamespace(create_namespaced_event=create_namespaced_event)

    async def _call(self, method: Any, *args: Any, **_: Any) -> Any:
        if self.fail:
            raise ApiException(status=403, reason="Forbidden")
        self.calls.append((method.__name__, args))
        return args[-1]


def _emit_outside_kopf(kube: RecordingKube) -> None:
    async def main() -> None:
        handlers._emit(JOB, "Warning", "NoNodeFits", "Pending: no node offers 8 GPUs")  # a plain task
        await asyncio.gather(*handlers._posting)

    handlers._state["reconciler"] = SimpleNamespace(kube=kube)
    try:
        asyncio.run(main())
    finally:
        handlers._state.pop("reconciler")


def test_an_event_is_posted_from_outside_any_kopf_handler() -> None:
    kube = RecordingKube()
    _emit_outside_kopf(kube)
    ((method, (namespace, body)),) = kube.calls
    assert (method, namespace) == ("create_namespaced_event", "ml")
    assert body["involvedObject"] == {
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "name": "job-a", "namespace": "ml", "uid": "u-1",
    }  # fmt: skip
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning",
        "NoNodeFits",
        "Pending: no node offers 8 GPUs",
    )
    assert body["metadata"] == {"generateName": "job-a.", "namespace": "ml"}
    assert body["source"] == {"component": "rljob-operator"} and body["count"] == 1
    assert len(body["eventTime"]) == len("2026-11-24T03:00:00.000000Z")  # microseconds keep the order


def test_a_failed_post_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rljob.operator"):
        _emit_outside_kopf(RecordingKube(fail=True))
    assert "cannot post event NoNodeFits on ml/job-a: API error 403 Forbidden" in caplog.text
