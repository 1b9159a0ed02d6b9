"""kopf wiring (thin): every event on a job, its RayJob, its pods or a ResourceQuota leads to the
same level-based reconcile. No change/timer/daemon handlers, so kopf adds no finalizers: children
are removed by garbage collection through their owner references."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from rljob_api.resource import GROUP, PLURAL, VERSION

from .build import BuildSettings
from .kube import Kube, load_config
from .metrics import Metrics
from .names import FINALIZER, GROUP_PREFIX, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from .reconcile import Reconciler
from .status import TERMINAL

log = logging.getLogger("rljob.operator")


class Options:
    """Set by __main__ before kopf starts."""

    settings = BuildSettings()
    resync_seconds = 60.0


_state: dict[str, Any] = {}


def reconciler() -> Reconciler:
    return _state["reconciler"]


def _emit(obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(obj, type=type_, reason=reason, message=message[:1024])


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP_PREFIX)
    settings.posting.level = logging.INFO
    settings.networking.error_backoffs = [1, 2, 5, 10, 30, 60]
    settings.watching.server_timeout = 300
    load_config()
    _state["reconciler"] = Reconciler(
        Kube(), Options.settings, _state.setdefault("metrics", Metrics()), _emit
    )
    _state["resync"] = asyncio.create_task(_resync_forever())


@kopf.on.cleanup()
async def _cleanup(**_: Any) -> None:
    task = _state.pop("resync", None)
    if task is not None:
        task.cancel()


async def _resync_forever() -> None:
    """The slow timer: reconcile every job now and then, whatever the events said."""
    while True:
        await asyncio.sleep(Options.resync_seconds)
        try:
            jobs = await reconciler().kube.list_jobs()
        except Exception as exc:
            log.warning("resync: cannot list jobs: %s", exc)
            continue
        for job in jobs:
            await reconciler().reconcile(job["metadata"]["namespace"], job["metadata"]["name"])


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    if event["type"] == "DELETED":
        reconciler().metrics.forget((namespace, name))
        await _requeue_waiting(namespace)  # a deleted job may free GPUs for queued ones
        return
    await reconciler().reconcile(namespace, name)


@kopf.on.event("ray.io", "v1", "rayjobs", labels={LABEL_MANAGED_BY: MANAGED_BY})
async def rayjob_event(namespace: str, labels: dict[str, str], **_: Any) -> None:
    if LABEL_JOB in labels:
        await reconciler().reconcile(namespace, labels[LABEL_JOB])


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
async def pod_event(namespace: str, labels: dict[str, str], **_: Any) -> None:
    await reconciler().reconcile(namespace, labels[LABEL_JOB])


@kopf.on.event("", "v1", "resourcequotas")
async def quota_event(namespace: str, **_: Any) -> None:
    await _requeue_waiting(namespace)


async def _requeue_waiting(namespace: str) -> None:
    for job in await reconciler().kube.list_jobs(namespace):
        if (job.get("status") or {}).get("phase") not in (*TERMINAL, "Running"):
            await reconciler().reconcile(namespace, job["metadata"]["name"])
