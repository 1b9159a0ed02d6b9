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
from .kube import load_config
from .metrics import Metrics
from .names import FINALIZER, GROUP_PREFIX, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from .permissions import describe_api_error
from .reconcile import Reconciler
from .watch_cache import CachedKube, WatchCaches, slim_job, slim_node, slim_pod, slim_quota, slim_rayjob

log = logging.getLogger("rljob.operator")


class Options:
    """Set by __main__ before kopf starts."""

    settings = BuildSettings()
    resync_seconds = 60.0
    namespaces: tuple[str, ...] = ()  # empty: the whole cluster


class _NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff base (a deep copy of the object, less system fields) on every event of every
    watched object, for on.create/on.update handlers; the operator has none (only event handlers
    and indices), so the copy served nothing and took a tenth of its CPU in a burst of jobs."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


_state: dict[str, Any] = {}
_caches = WatchCaches()  # kopf's indices, handed over by the first handler that runs


def reconciler() -> Reconciler:
    return _state["reconciler"]


_posting: set[asyncio.Task[None]] = set()  # strong references until each event is posted


def _emit(obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Post without holding up the reconcile; a failure is logged whole, never raised."""

    async def post() -> None:
        try:
            await reconciler().kube.post_event(obj, type_, reason, message)
        except Exception as exc:
            log.warning(
                "cannot post event %s on %s/%s: %s",
                reason,
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
                describe_api_error(exc),
            )

    task = asyncio.get_running_loop().create_task(post())
    _posting.add(task)
    task.add_done_callback(_posting.discard)


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP_PREFIX)
    settings.persistence.diffbase_storage = _NoDiffBase(prefix=GROUP_PREFIX)
    settings.posting.enabled = False  # every event is ours (kube.post_event), posted from any context
    settings.networking.error_backoffs = [1, 2, 5, 10, 30, 60]
    settings.watching.server_timeout = 300
    # Serve the resources found at startup: watching CRDs and namespaces for changes would need
    # cluster-wide list/watch on both, which the chart's least-privilege role does not grant.
    settings.scanning.disabled = True
    await load_config()
    metrics = _state.setdefault("metrics", Metrics())
    _state["reconciler"] = Reconciler(
        CachedKube(_caches, on_request=metrics.observe_request), Options.settings, metrics, _emit
    )
    _state["resync"] = asyncio.create_task(_resync_forever())


@kopf.on.cleanup()
async def _cleanup(**_: Any) -> None:
    task = _state.pop("resync", None)
    if task is not None:
        task.cancel()
    if "reconciler" in _state:
        await asyncio.gather(*_posting, return_exceptions=True)  # the last events go out first
        await _state.pop("reconciler").kube.close()


async def _resync_forever() -> None:
    """The slow timer: reconcile every job now and then, whatever the events said."""
    while True:
        await asyncio.sleep(Options.resync_seconds)
        try:
            jobs = [
                job
                for namespace in Options.namespaces or (None,)
                for job in await reconciler().kube.list_jobs(namespace)
            ]
        except Exception as exc:
            log.warning("resync: cannot list jobs: %s", describe_api_error(exc))
            continue
        # What was deleted or edited by hand comes back; what is kept of jobs now gone is dropped.
        reconciler().reapply_all({(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs})
        for job in jobs:
            await reconciler().reconcile(job["metadata"]["namespace"], job["metadata"]["name"])


# The watch caches (watch_cache.py): kopf indexes what its watches see; the reconciler's list calls
# read these indices. Keyed by namespace (nodes: None; jobs and pods: (namespace, job)). Async: kopf
# runs sync handlers in threads.
@kopf.index(GROUP, VERSION, PLURAL)
async def rljob_jobs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): slim_job(body)}  # a pass reads its own job from here


@kopf.index("ray.io", "v1", "rayjobs", labels={LABEL_MANAGED_BY: MANAGED_BY})
async def rljob_rayjobs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): slim_rayjob(body)}  # a pass reads its job's RayJob from here


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
async def rljob_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): slim_pod(body)}  # a pass reads its own job's pods


@kopf.index("", "v1", "resourcequotas")
async def rljob_quotas(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {namespace: slim_quota(body)}


@kopf.index("", "v1", "nodes")
async def rljob_nodes(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {None: slim_node(body)}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(event: kopf.RawEvent, namespace: str | None, name: str, **kwargs: Any) -> None:
    assert namespace is not None  # a namespaced kind (kopf's type allows cluster-scoped ones)
    _caches.capture(kwargs)
    if event["type"] == "DELETED":
        # A pass finds it gone and forgets it, after any pass still running for it (the job's lock).
        await reconciler().reconcile(namespace, name)
        await _requeue_waiting(namespace)  # a deleted job may free GPUs for queued ones
        return
    # The version lets the reconciler skip the event of its own status write (reconcile.py).
    version = (event["object"].get("metadata") or {}).get("resourceVersion")
    await reconciler().reconcile(namespace, name, version)


# Events of a job's children run background passes (reconcile.py: they take turns, so a burst of new
# jobs is not held up behind KubeRay's status writes).
@kopf.on.event("ray.io", "v1", "rayjobs", labels={LABEL_MANAGED_BY: MANAGED_BY})
async def rayjob_event(
    event: kopf.RawEvent, namespace: str | None, name: str, labels: kopf.Labels, **kwargs: Any
) -> None:
    assert namespace is not None
    _caches.capture(kwargs)
    # The index now has this RayJob as the event shows it (kopf indexes before it calls handlers).
    reconciler().rayjob_seen(namespace, name, (event["object"].get("metadata") or {}).get("uid", ""))
    if LABEL_JOB in labels:
        # The version lets the reconciler skip the event of its own apply; a deletion always runs a pass.
        version = (event["object"].get("metadata") or {}).get("resourceVersion")
        rayjob = (name, version) if version and event["type"] != "DELETED" else None
        await reconciler().reconcile(namespace, labels[LABEL_JOB], rayjob=rayjob, background=True)


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
async def pod_event(namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
    assert namespace is not None
    _caches.capture(kwargs)
    await reconciler().reconcile(namespace, labels[LABEL_JOB], background=True)


@kopf.on.event("", "v1", "resourcequotas")
async def quota_event(namespace: str | None, **kwargs: Any) -> None:
    assert namespace is not None
    _caches.capture(kwargs)
    await _requeue_waiting(namespace)


async def _requeue_waiting(namespace: str) -> None:
    """Reconcile the namespace's Queued jobs: what freed GPU quota may admit them. Only those: every
    other job has events of its own, and re-running each starting job at every deletion made
    deleting N jobs cost N^2 passes."""
    for job in await reconciler().kube.list_jobs(namespace):
        if (job.get("status") or {}).get("phase") == "Queued":
            await reconciler().reconcile(namespace, job["metadata"]["name"])
