"""Lists served from memory: kopf's indices of the objects the operator watches anyway.

kopf keeps one watch per resource kind (its event handlers need them) and, with `@kopf.index`, an
in-memory index of each object it sees, updated from the same stream (re-listed after a 410 Gone or
a broken connection). kopf runs no handler before every index has finished its first listing, so an
index handed to a handler is complete and stays current. `CachedKube` serves the reconciler's list
calls (jobs, RayJobs, pods, ResourceQuotas, nodes) from them: a reconcile of an unchanged job makes
no list call. Until a handler has handed the indices over (the first moments after a start) it
lists from the API server as before.

Each index keeps only the fields the operator reads (`slim_*`), not whole objects: the pods of a
thousand jobs would otherwise hold tens of megabytes of managedFields and specs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .checks import NodeInfo
from .kube import Kube
from .names import LABEL_JOB
from .pod_states import NodeDown, not_ready

# The index names: the kopf handlers of these names (handlers.py) fill them.
JOBS, RAYJOBS, PODS, QUOTAS, NODES = (
    "rljob_jobs",
    "rljob_rayjobs",
    "rljob_pods",
    "rljob_quotas",
    "rljob_nodes",
)
INDICES = (JOBS, RAYJOBS, PODS, QUOTAS, NODES)
# Keyed by namespace (nodes: None), but the jobs and RayJobs by (namespace, name) and the pods by
# (namespace, the job they are labelled with): a pass looks up its own without scanning the namespace.
Index = Mapping[Any, Iterable[dict[str, Any]]]  # the slim_* dicts the index handlers return


def _pick(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj.get(k) is not None}


def _meta(body: Mapping[str, Any], *extra: str) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return _pick(meta, "name", "namespace", "uid", "labels", "deletionTimestamp", "creationTimestamp", *extra)


def slim_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """A job as a pass and the quota decision read it (spec, status, identity; job.py reads no other
    field)."""
    return {
        "metadata": _meta(body, "generation", "annotations", "resourceVersion"),
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


def slim_rayjob(body: Mapping[str, Any]) -> dict[str, Any]:
    """A RayJob as a pass and the quota decision read it: whose it is (ownerReferences), which
    version (generation: whether it was edited since the operator applied it), whether it is
    suspended, and its status (KubeRay's, a few fields plus its Ray cluster's summary). Not its spec:
    the Ray cluster's pod templates are the operator's own and the largest part of it."""
    return {
        "metadata": _meta(body, "generation", "resourceVersion", "ownerReferences"),
        "spec": _pick(body.get("spec") or {}, "suspend"),
        "status": dict(body.get("status") or {}),
    }


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as the quota (GPU requests) and the stuck-pod checks (pod_states.py) read it."""
    spec = body.get("spec") or {}
    containers = [
        {"name": c.get("name"), "resources": _pick(c.get("resources") or {}, "requests")}
        for c in spec.get("containers") or []
    ]
    return {
        "metadata": _meta(body, "ownerReferences"),
        "spec": {"containers": containers, **_pick(spec, "nodeName")},
        "status": dict(body.get("status") or {}),
    }


def slim_quota(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": _meta(body), "status": _pick(body.get("status") or {}, "hard", "used")}


def slim_node(body: Mapping[str, Any]) -> dict[str, Any]:
    """A node as the pre-flight GPU check and the not-Ready check (pod_states.node_down) read it."""
    status = body.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": _meta(body),
        "spec": _pick(body.get("spec") or {}, "unschedulable"),
        "status": {**_pick(status, "allocatable"), **({"conditions": ready} if ready else {})},
    }


def selected(labels: Mapping[str, str], selector: str) -> bool:
    """Whether `labels` match an equality-based label selector (`k`, `!k`, `k=v`, `k==v`, `k!=v`,
    comma-separated): the only kind the operator uses."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class WatchCaches:
    """kopf's indices, once a handler has handed them over (`capture`)."""

    def __init__(self) -> None:
        self.indices: dict[str, Index] | None = None

    def capture(self, kwargs: Mapping[str, Any]) -> None:
        """Keep the indices a handler received (live views: kopf updates them in place)."""
        if self.indices is None and all(name in kwargs for name in INDICES):
            self.indices = {name: kwargs[name] for name in INDICES}

    @property
    def ready(self) -> bool:
        return self.indices is not None

    def items(self, index: str, namespace: str | None, selector: str | None = None) -> list[dict[str, Any]]:
        """The objects of one namespace (None: all) whose labels match `selector`, sorted by
        namespace and name as a list call returns them. The cached objects themselves, not copies:
        callers only read them (copying every job on every pass of a quota'd namespace, or at every
        deletion, was the operator's largest cost in a burst), and each is replaced whole by the
        next event on it."""
        assert self.indices is not None
        found = self.indices[index]
        if namespace is None:
            keys = list(found)
        elif index in (PODS, JOBS, RAYJOBS):  # keyed by (namespace, name): see pods_of, job, rayjob
            keys = [key for key in found if key[0] == namespace]
        else:
            keys = [namespace]
        out = [
            obj
            for key in keys
            if key in found
            for obj in found[key]
            if selector is None or selected(obj["metadata"].get("labels") or {}, selector)
        ]
        return sorted(out, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert self.indices is not None
        return next(iter(self.indices[JOBS].get((namespace, name), ())), None)

    def rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert self.indices is not None
        return next(iter(self.indices[RAYJOBS].get((namespace, name), ())), None)

    def pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The pods of one job. The pod index is keyed by (namespace, job label), so a pass finds its
        job's pods without matching every pod of the namespace against a selector (a pass per event
        of a thousand starting jobs each scanned two thousand pods)."""
        assert self.indices is not None
        return sorted(self.indices[PODS].get((namespace, job), ()), key=lambda o: o["metadata"]["name"])


class CachedKube(Kube):
    """Kube whose list calls read the watch caches once they are ready."""

    def __init__(
        self, caches: WatchCaches, api: Any = None, on_request: Callable[[str, float], None] | None = None
    ) -> None:
        super().__init__(api, on_request)
        self.caches = caches

    def cached_job(self, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(True, the job as the watch last showed it (slim_job), or None: there is none) once the caches
        are ready; (False, None) before."""
        return (True, self.caches.job(namespace, name)) if self.caches.ready else (False, None)

    def cached_rayjob(self, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(True, the RayJob as the watch last showed it (slim_rayjob), or None: there is none) once
        the caches are ready; (False, None) before."""
        return (True, self.caches.rayjob(namespace, name)) if self.caches.ready else (False, None)

    async def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if not self.caches.ready:
            return await super().list_jobs(namespace)
        return self.caches.items(JOBS, namespace)

    async def list_rayjobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        if not self.caches.ready:
            return await super().list_rayjobs(namespace, selector)
        return self.caches.items(RAYJOBS, namespace, selector)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        if not self.caches.ready:
            return await super().list_pods(namespace, selector)
        key, equals, job = selector.partition("=")
        if key == LABEL_JOB and equals and job and "," not in job and not job.startswith("="):
            return self.caches.pods_of(namespace, job)
        return self.caches.items(PODS, namespace, selector)

    async def list_quotas(self, namespace: str) -> list[dict[str, Any]]:
        if not self.caches.ready:
            return await super().list_quotas(namespace)
        return self.caches.items(QUOTAS, namespace)

    async def nodes_not_ready(self) -> dict[str, NodeDown]:
        if not self.caches.ready:
            return await super().nodes_not_ready()
        return not_ready(self.caches.items(NODES, None))

    async def list_nodes(self) -> list[NodeInfo]:
        if not self.caches.ready:
            return await super().list_nodes()
        return [
            NodeInfo(
                n["metadata"]["name"], n["metadata"].get("labels") or {}, n["status"].get("allocatable") or {}
            )
            for n in self.caches.items(NODES, None)
            if not n["spec"].get("unschedulable")
        ]
