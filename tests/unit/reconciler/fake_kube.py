"""FakeKube: a TEST DOUBLE for `rljob_operator.kube.Kube`, an in-memory stand-in for the API server
so the Reconciler can be driven pass by pass, with injected failures, in milliseconds. The e2e
tests run the real API server; this layer sits between them and the pure unit tests.

Modelled (what the Reconciler's correctness depends on):
- objects keyed by (apiVersion/kind, namespace, name); uid, creationTimestamp (1 s apart, the API
  server's resolution), resourceVersion bumped only by a write that changes something, generation
  bumped by a change outside metadata and status;
- server-side apply with force: each field manager's last applied config is kept, and the object is
  those configs merged in the order they were last written, so a field stays while some manager
  still applies it and goes when its last one stops (the Kueue gate's `spec.suspend`, the runtime's
  `status.progress`); `metadata.managedFields` lists the managers;
- the status subresource of RLTrainingJob and RayJob: an apply to the object ignores `status`, an
  apply to /status changes only `status` and is a 404 when the object is gone;
- equality label selectors (`k`, `!k`, `k=v`, `k==v`, `k!=v`), lists sorted by namespace and name;
- garbage collection of owned objects (ownerReferences uid), at once, on `delete`;
- failures: `fail(method, exc, times, when)` raises before the call has any effect;
- watches, as a log of events (`watch`: ADDED, MODIFIED, DELETED, each with the object as written),
  which `Harness.settle` (or `deliver_next`, one kind's next event) delivers through handlers.py's
  event handlers, updating the operator's caches first as kopf does: the jobs, and the RayJobs as
  `slim_rayjob` keeps them (the caches count as handed over from the first delivered event on).

Not modelled: admission (CEL rules, ResourceQuota enforcement, webhooks), RBAC (a 403 happens only
when injected), field-ownership conflicts without force, list-type semantics of SSA (lists are
replaced whole, never merged by key), defaulting and pruning by schemas, watch errors and re-lists
(every event is delivered, in order), resourceVersion
preconditions (but delete_rayjob's uid precondition), set-based selectors, finalizers and
deletionTimestamp (but a RayJob deleted with `slow_deletes`), and the controllers
themselves: the tests play KubeRay, Kueue, the kubelet and the runtime with the helpers below.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from rljob_api.contract import OPERATOR_FIELD_MANAGER, RUNTIME_FIELD_MANAGER
from rljob_api.resource import API_VERSION, KIND
from rljob_operator import handlers
from rljob_operator.build import BuildSettings
from rljob_operator.checks import NodeInfo
from rljob_operator.kube import PLURALS, Kube, timeout_message
from rljob_operator.metrics import Metrics
from rljob_operator.names import LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE, MANAGED_BY
from rljob_operator.pod_states import NodeDown, not_ready
from rljob_operator.reconcile import Reconciler
from rljob_operator.watch_cache import selected, slim_rayjob  # selected: the API server's selectors

from spec_cases import BASE_SPEC, patched

JOB = f"{API_VERSION}/{KIND}"
RAYJOB = "ray.io/v1/RayJob"
POD, NODE, QUOTA, EVENT = "v1/Pod", "v1/Node", "v1/ResourceQuota", "v1/Event"
SA, ROLE, BINDING = (
    "v1/ServiceAccount",
    "rbac.authorization.k8s.io/v1/Role",
    "rbac.authorization.k8s.io/v1/RoleBinding",
)
_WITH_STATUS = {JOB, RAYJOB}  # kinds whose status is a subresource
_CORE_PLURALS = {"secrets": "v1/Secret", "persistentvolumeclaims": "v1/PersistentVolumeClaim"}
_SERVER_META = ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields")
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "manifests"
OPERATOR_USER = "system:serviceaccount:rljob-system:rljob"
Key = tuple[str, str, str]  # (apiVersion/kind, namespace ("" if cluster-scoped), name)


def api_error(status: int, reason: str, message: str, **details: Any) -> ApiException:
    """An ApiException whose body is the API server's JSON Status, as the real client raises it."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message}
    body |= {"reason": reason, "details": details, "code": status}
    error = ApiException(status=status, reason=reason)
    error.body = json.dumps(body)  # as kube.py sets it from the response
    return error


def forbidden(verb: str, plural: str, group: str, namespace: str, name: str) -> ApiException:
    resource = f"{plural}.{group}" if group else plural
    message = (
        f'{resource} "{name}" is forbidden: User "{OPERATOR_USER}" cannot {verb} resource "{plural}" '
        f'in API group "{group}" in the namespace "{namespace}"'
    )
    return api_error(403, "Forbidden", message, name=name, group=group, kind=plural)


def conflict(plural: str, group: str, name: str) -> ApiException:
    message = (
        f'Operation cannot be fulfilled on {plural}.{group} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return api_error(409, "Conflict", message, name=name, group=group, kind=plural)


def server_error() -> ApiException:
    return api_error(500, "InternalError", "Internal error occurred: etcdserver: request timed out")


def timeout() -> TimeoutError:
    """What Kube raises when the client's 60 s request timeout runs out."""
    return TimeoutError(timeout_message("patch_namespaced_custom_object"))


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    raised: BaseException | None = None


@dataclass
class _Failure:
    method: str
    exc: BaseException
    times: int | None  # None: until heal()
    when: Callable[..., bool]


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    kind: str
    obj: dict[str, Any]


@dataclass
class _Stored:
    obj: dict[str, Any]
    writes: dict[tuple[str, str], tuple[int, dict[str, Any]]] = field(default_factory=dict)


class FakeKube:
    """Same async methods as Kube (test_fake_kube_contract.py holds it to that); plus sync helpers
    for the tests to play the other controllers."""

    def __init__(self) -> None:
        self.store: dict[Key, _Stored] = {}
        self.calls: list[Call] = []
        self._failures: list[_Failure] = []
        self._seq = 0  # write order, for the SSA merge and resourceVersions
        self._clock = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
        self.slow_deletes = False  # delete_rayjob leaves the RayJob terminating (see there)
        self.watch: list[WatchEvent] = []  # every change, in order, until Harness.settle delivers it
        # The operator's watch cache of jobs: each as its last delivered event showed it (behind the
        # store until Harness.settle delivers the events).
        self.cached: dict[tuple[str, str], dict[str, Any]] = {}
        # Its index of RayJobs (slim_rayjob, as kopf's), from the first delivered event on: handlers.py
        # hands the caches over in the first handler that runs.
        self.cached_rayjobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.caches_ready = False

    # --- failure injection and call log ---

    def fail(
        self,
        method: str,
        exc: BaseException,
        times: int | None = 1,
        when: Callable[..., bool] = lambda *a, **k: True,
    ) -> None:
        """Raise `exc` from the next `times` calls of `method` whose arguments satisfy `when`."""
        if not hasattr(Kube, method):
            raise ValueError(f"Kube has no method {method!r}")
        self._failures.append(_Failure(method, exc, times, when))

    def heal(self) -> None:
        self._failures.clear()

    # --- the clock: 1 s per object created, moved on by hand; the Reconciler's clock in Harness ---

    def now(self) -> datetime:
        return self._clock

    def advance(self, seconds: float) -> None:
        self._clock += timedelta(seconds=seconds)

    def _enter(self, method: str, *args: Any, **kwargs: Any) -> None:
        failure = next((f for f in self._failures if f.method == method and f.when(*args, **kwargs)), None)
        self.calls.append(Call(method, args, kwargs, failure.exc if failure else None))
        if failure is None:
            return
        if failure.times is not None:
            failure.times -= 1
            if failure.times == 0:
                self._failures.remove(failure)
        raise failure.exc

    def calls_to(self, *methods: str) -> list[Call]:
        return [c for c in self.calls if c.method in methods]

    # --- the Kube interface ---

    async def close(self) -> None:
        self._enter("close")

    def cached_job(self, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        self._enter("cached_job", namespace, name)
        return (True, self.cached.get((namespace, name))) if self.caches_ready else (False, None)

    def cached_rayjob(self, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        self._enter("cached_rayjob", namespace, name)
        if not self.caches_ready:
            return False, None
        cached = self.cached_rayjobs.get((namespace, name))
        return True, frozen(cached) if cached is not None else None

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._enter("get_job", namespace, name)
        return self.get(JOB, namespace, name)

    async def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        self._enter("list_jobs", namespace)
        return self._list(JOB, namespace, "")

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._enter("get_rayjob", namespace, name)
        return self.get(RAYJOB, namespace, name)

    async def list_rayjobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self._enter("list_rayjobs", namespace, selector)
        return self._list(RAYJOB, namespace, selector)

    async def delete_rayjob(self, namespace: str, name: str, uid: str) -> None:
        """Gone at once, or, with `slow_deletes` (KubeRay's finalizer, the foreground deletion of its
        Ray cluster), still there with a deletionTimestamp until the test calls `delete`."""
        self._enter("delete_rayjob", namespace, name, uid)
        stored = self.store.get((RAYJOB, namespace, name))
        if stored is None:
            return
        if stored.obj["metadata"]["uid"] != uid:
            message = f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
            raise api_error(409, "Conflict", message + stored.obj["metadata"]["uid"])
        if self.slow_deletes:
            stored.obj["metadata"].setdefault("deletionTimestamp", self._clock.strftime("%Y-%m-%dT%H:%M:%SZ"))
            return
        self.delete(RAYJOB, namespace, name)

    async def list_quotas(self, namespace: str) -> list[dict[str, Any]]:
        self._enter("list_quotas", namespace)
        return self._list(QUOTA, namespace, "")

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self._enter("list_pods", namespace, selector)
        return self._list(POD, namespace, selector)

    async def list_nodes(self) -> list[NodeInfo]:
        self._enter("list_nodes")
        return [
            NodeInfo(n["metadata"]["name"], n["metadata"].get("labels") or {}, n["status"]["allocatable"])
            for n in self._list(NODE, "", "")
            if not n["spec"].get("unschedulable")
        ]

    async def nodes_not_ready(self) -> dict[str, NodeDown]:
        self._enter("nodes_not_ready")
        return not_ready(self._list(NODE, "", ""))

    async def exists(self, namespace: str, resource: str, name: str) -> bool:
        self._enter("exists", namespace, resource, name)
        return (_CORE_PLURALS.get(resource, ""), namespace, name) in self.store

    async def apply(
        self, obj: Mapping[str, Any], *, subresource: str = "", manager: str = OPERATOR_FIELD_MANAGER
    ) -> dict[str, Any]:
        self._enter("apply", copy.deepcopy(dict(obj)), subresource=subresource, manager=manager)
        if (obj["apiVersion"], obj["kind"]) not in PLURALS:
            raise KeyError((obj["apiVersion"], obj["kind"]))  # the real client has no path for it
        return self._write(obj, manager, subresource)

    async def apply_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("apply_job_status", namespace, name, copy.deepcopy(dict(status)))
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace}}
        return self._write({**body, "status": status}, OPERATOR_FIELD_MANAGER, "status")

    async def post_event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self._enter("post_event", obj, type_, reason, message)
        meta = obj["metadata"]
        event = {
            "type": type_,
            "reason": reason,
            "message": message,
            "involvedObject": {"name": meta["name"]},
        }
        self.put(EVENT, meta["namespace"], f"{meta['name']}.{self._seq + 1}", event, manager="rljob-operator")

    # --- the store (SSA with force, per field manager) ---

    def _write(self, obj: Mapping[str, Any], manager: str, subresource: str) -> dict[str, Any]:
        meta = obj["metadata"]
        kind = f"{obj['apiVersion']}/{obj['kind']}"
        key = (kind, meta.get("namespace") or "", meta["name"])
        config = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("apiVersion", "kind")}
        config["metadata"] = {k: v for k, v in config["metadata"].items() if k not in _SERVER_META}
        if subresource == "status":
            if key not in self.store:
                raise api_error(404, "NotFound", f'{kind} "{meta["name"]}" not found')
            config = {"status": config.get("status") or {}}
        elif kind in _WITH_STATUS:
            config.pop("status", None)
        stored = self.store.get(key)
        if stored is None:
            self._clock += timedelta(seconds=1)
            server = {"uid": f"uid-{self._seq + 1}-{meta['name']}", "generation": 1}
            server["creationTimestamp"] = self._clock.strftime("%Y-%m-%dT%H:%M:%SZ")
            stored = self.store[key] = _Stored({"metadata": {**server, "resourceVersion": "0"}})
        self._seq += 1
        stored.writes[(manager, subresource)] = (self._seq, config)
        old = stored.obj
        new = {"apiVersion": kind.rsplit("/", 1)[0], "kind": kind.rsplit("/", 1)[1]}
        for _, applied in sorted(stored.writes.values(), key=lambda w: w[0]):
            _merge(new, copy.deepcopy(applied))
        server = {
            k: old["metadata"][k]
            for k in ("uid", "creationTimestamp", "generation", "resourceVersion", "deletionTimestamp")
            if k in old["metadata"]
        }
        server["managedFields"] = [{"manager": m, "subresource": s} for m, s in stored.writes]
        new["metadata"] |= server
        if new != old:
            created = old["metadata"]["resourceVersion"] == "0"
            new["metadata"]["resourceVersion"] = str(self._seq)
            if _body(new) != _body(old) and not created:
                new["metadata"]["generation"] += 1
            self.watch.append(WatchEvent("ADDED" if created else "MODIFIED", kind, copy.deepcopy(new)))
        stored.obj = new
        return copy.deepcopy(new)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object as a read returns it (a copy), without recording a call."""
        stored = self.store.get((kind, namespace, name))
        return copy.deepcopy(stored.obj) if stored else None

    def _list(self, kind: str, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        """Read-only views, as the operator's watch caches hand out the cached objects themselves
        (watch_cache.py): a reconciler that changed a listed object fails here with a TypeError."""
        return [
            frozen(s.obj)
            for (k, ns, _), s in sorted(self.store.items())
            if k == kind
            and namespace in (None, ns)
            and selected(s.obj["metadata"].get("labels") or {}, selector)
        ]

    def put(
        self, kind: str, namespace: str, name: str, body: Mapping[str, Any], manager: str = "test"
    ) -> None:
        """Create or update an object as another client (kubectl, a controller) would."""
        api_version, kind_name = kind.rsplit("/", 1)
        obj = {"apiVersion": api_version, "kind": kind_name, **copy.deepcopy(dict(body))}
        obj["metadata"] = {**obj.get("metadata", {}), "name": name} | (
            {"namespace": namespace} if namespace else {}
        )
        self._write(obj, manager, "")

    def put_status(
        self, kind: str, namespace: str, name: str, status: Mapping[str, Any], manager: str
    ) -> None:
        api_version, kind_name = kind.rsplit("/", 1)
        meta = {"name": name, "namespace": namespace}
        self._write(
            {"apiVersion": api_version, "kind": kind_name, "metadata": meta, "status": status},
            manager,
            "status",
        )

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete, and garbage-collect what it owns (at once: no finalizers are modelled)."""
        stored = self.store.pop((kind, namespace, name))
        self.watch.append(WatchEvent("DELETED", kind, copy.deepcopy(stored.obj)))
        uid = stored.obj["metadata"]["uid"]
        for key, other in list(self.store.items()):
            owners = other.obj["metadata"].get("ownerReferences") or []
            if key in self.store and any(r.get("uid") == uid for r in owners):
                self.delete(*key)

    # --- the other actors, played by the tests ---

    def create_job(
        self, name: str, patch: Mapping[str, Any] | None = None, *, example: str = "", namespace: str = "ml"
    ) -> dict[str, Any]:
        """`kubectl apply` of an example manifest, or of tests/spec_cases.BASE_SPEC with `patch`."""
        spec = yaml.safe_load((EXAMPLES / example).read_text())["spec"] if example else BASE_SPEC
        self.put(JOB, namespace, name, {"spec": patched(dict(patch or {}), spec)}, manager="kubectl")
        return self.get(JOB, namespace, name) or {}

    def set_quota(
        self, hard: int, used: int = 0, namespace: str = "ml", name: str = "gpus", gpu: str = "nvidia.com/gpu"
    ) -> None:
        key = f"requests.{gpu}"
        self.put(QUOTA, namespace, name, {"spec": {"hard": {key: str(hard)}}})
        status = {"hard": {key: str(hard)}, "used": {key: str(used)}}
        self.put_status(QUOTA, namespace, name, status, "kube-controller-manager")

    def add_node(self, name: str, gpus: int = 8, labels: Mapping[str, str] | None = None) -> None:
        body = {"metadata": {"labels": dict(labels or {})}, "spec": {}}
        self.put(NODE, "", name, {**body, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}})

    def set_node_ready(self, name: str, status: str, reason: str = "", message: str = "") -> None:
        """The node's Ready condition as the kubelet (True) or the node lifecycle controller (Unknown,
        when the kubelet stopped posting) writes it."""
        stamp = self._clock.strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp,
        }
        self.put_status(NODE, "", name, {"conditions": [condition]}, "kube-controller-manager")

    def add_pod(
        self,
        job: str,
        name: str,
        *,
        gpus: int = 0,
        phase: str = "Pending",
        waiting: Mapping[str, str] | None = None,
        role: str = "gpu",
        unschedulable: str = "",
        node: str = "",
        **container_status: Any,
    ) -> None:
        """A pod of `job` (labelled as KubeRay labels them from the RayJob's templates), as the
        kubelet reports it (`waiting`, `container_status`) or the scheduler (`unschedulable`: its
        message); a second call replaces the pod's status."""
        container = {"name": "ray-worker", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
        state = {"waiting": dict(waiting)} if waiting else {"running": {}}
        statuses = [{"name": "ray-worker", "image": "rljob/runtime:test", "state": state, **container_status}]
        status: dict[str, Any] = {"phase": phase, "containerStatuses": statuses}
        if unschedulable:
            scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            stamp = self._clock.strftime("%Y-%m-%dT%H:%M:%SZ")
            status["conditions"] = [{**scheduled, "message": unschedulable, "lastTransitionTime": stamp}]
        body = {
            "metadata": {"labels": {LABEL_JOB: job, LABEL_ROLE: role}},
            "spec": {"containers": [container], **({"nodeName": node} if node else {})},
            "status": status,
        }
        self.put(POD, "ml", name, body, manager="kubelet")

    def set_rayjob_status(self, name: str, namespace: str = "ml", **status: Any) -> None:
        """KubeRay's status update (replaces what KubeRay wrote before)."""
        self.put_status(RAYJOB, namespace, name, status, "kuberay-operator")

    def kueue_set_suspend(self, name: str, suspend: bool, namespace: str = "ml") -> None:
        """Kueue admits (False) or preempts (True) the RayJob by writing its spec.suspend."""
        self.put(RAYJOB, namespace, name, {"spec": {"suspend": suspend}}, manager="kueue-controller")

    def report_progress(self, name: str, progress: Mapping[str, Any], namespace: str = "ml") -> None:
        self.put_status(JOB, namespace, name, {"progress": dict(progress)}, RUNTIME_FIELD_MANAGER)


class _ReadOnlyList(list[Any]):
    def _refuse(self, *_: Any, **__: Any) -> None:
        raise TypeError("a listed object is read-only: copy it before changing it")

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


class _ReadOnlyDict(dict[str, Any]):
    def _refuse(self, *_: Any, **__: Any) -> None:
        raise TypeError("a listed object is read-only: copy it before changing it")

    pop = popitem = clear = update = setdefault = _refuse
    __setitem__ = __delitem__ = __ior__ = _refuse


def frozen(obj: Any) -> Any:
    """A deep read-only copy (still a dict and lists, as pydantic and the code expect) whose changes
    raise TypeError."""
    if isinstance(obj, Mapping):
        return _ReadOnlyDict({k: frozen(v) for k, v in obj.items()})
    if isinstance(obj, list | tuple):
        return _ReadOnlyList(frozen(v) for v in obj)
    return obj


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _body(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


@dataclass
class Timer:
    """A retry the Reconciler scheduled with loop.call_later: recorded, never waited for."""

    delay: float
    callback: Callable[[], Any]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Harness:
    """The Reconciler wired as handlers.py wires it, on a FakeKube, with its events and retry timers
    recorded (not posted, not waited for). Each pass runs in its own asyncio.run."""

    def __init__(self, settings: BuildSettings | None = None) -> None:
        self.kube = FakeKube()
        self.registry = CollectorRegistry()
        self.events: list[tuple[str, str, str]] = []
        self.timers: list[Timer] = []
        self.reconciler = Reconciler(
            kube=cast(Kube, self.kube),
            settings=settings or BuildSettings(),
            metrics=Metrics(self.registry),
            emit=self._emit,
            clock=self.kube.now,
        )

    def _emit(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))
        self.kube.calls.append(Call("emit", (type_, reason, message), {}))  # ordered among the writes

    def reconcile(self, name: str, namespace: str = "ml") -> None:
        self._run(lambda: self.reconciler.reconcile(namespace, name))

    def settle(self, limit: int = 200, only: str | None = None) -> int:
        """Deliver the watch events so far, and those the passes cause, one at a time through
        handlers.py's handlers, as kopf would; returns how many passes ran. Fails on a loop. `only`: a
        kind (RAYJOB, say): deliver its events only, the others stay on their way."""
        passes = self.passes()
        if self._deliver(limit, only):
            raise AssertionError(f"events still coming after {limit}: {self.kube.watch[:3]}")
        return int(self.passes() - passes)

    def deliver_next(self, kind: str) -> None:
        """Deliver the next watch event of `kind` only (the others stay on their way)."""
        assert any(e.kind == kind for e in self.kube.watch), f"no {kind} event on its way"
        self._deliver(1, kind)

    def _deliver(self, count: int, only: str | None) -> bool:
        """Deliver up to `count` events (of kind `only`, if given); True if more of them are left."""

        def ready() -> list[int]:
            return [i for i, e in enumerate(self.kube.watch) if only is None or e.kind == only]

        async def deliver() -> None:
            handlers._state["reconciler"] = self.reconciler
            try:
                for _ in range(count):
                    waiting = ready()
                    if not waiting:
                        return
                    await _dispatch(self.kube.watch.pop(waiting[0]))
            finally:
                handlers._state.pop("reconciler", None)

        self._run(deliver)
        return bool(ready())

    def passes(self) -> float:
        return self.reconciles("ok") + self.reconciles("error")

    def fire_retry(self) -> float:
        """Run the one pending retry as if its delay had passed; returns that delay."""
        pending = [t for t in self.timers if not t.cancelled]
        assert len(pending) == 1, pending
        pending[0].cancelled = True  # fired: it cannot fire again
        self._run(pending[0].callback)
        return pending[0].delay

    def _run(self, start: Callable[[], Awaitable[Any]]) -> None:
        async def main() -> None:
            asyncio.get_running_loop().call_later = self._call_later  # type: ignore[method-assign,assignment]
            await start()

        asyncio.run(main())

    def _call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        self.timers.append(Timer(delay, functools.partial(callback, *args)))
        return self.timers[-1]

    # --- reading what the operator wrote ---

    def status(self, name: str) -> dict[str, Any]:
        return (self.kube.get(JOB, "ml", name) or {}).get("status") or {}

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next(c for c in self.status(name)["conditions"] if c["type"] == kind)

    def reconciles(self, result: str) -> float:
        return self.registry.get_sample_value("rljob_operator_reconcile_total", {"result": result}) or 0.0

    def writes(self) -> list[str]:
        """The writes and events so far, in order: 'status:Phase', 'apply:Kind', 'event:Reason'."""
        out = []
        for call in self.kube.calls_to("apply_job_status", "apply", "emit"):
            if call.method == "apply_job_status":
                out.append(f"status:{call.args[2].get('phase')}")
            elif call.method == "apply":
                out.append(f"apply:{call.args[0]['kind']}")
            else:
                out.append(f"event:{call.args[1]}")
        return out


async def _dispatch(event: WatchEvent) -> None:
    """One watch event to the kopf handler that watches its kind (with the handlers' label filters)."""
    meta = event.obj["metadata"]
    namespace, labels = meta.get("namespace"), meta.get("labels") or {}
    kube = handlers.reconciler().kube
    kube.caches_ready = True  # type: ignore[attr-defined]
    if event.kind == RAYJOB and labels.get(LABEL_MANAGED_BY) == MANAGED_BY:  # kopf indexes first
        rayjobs = kube.cached_rayjobs  # type: ignore[attr-defined]
        if event.type == "DELETED":
            rayjobs.pop((namespace, meta["name"]), None)
        else:
            rayjobs[(namespace, meta["name"])] = slim_rayjob(event.obj)
    if event.kind == JOB:
        cache = handlers.reconciler().kube.cached  # type: ignore[attr-defined]
        if event.type == "DELETED":  # kopf updates its indices before it calls the handlers
            cache.pop((namespace, meta["name"]), None)
        else:
            cache[(namespace, meta["name"])] = event.obj
        raw = {"type": event.type, "object": event.obj}
        await handlers.job_event(event=raw, namespace=namespace, name=meta["name"])  # type: ignore[arg-type]
    elif event.kind == RAYJOB and labels.get(LABEL_MANAGED_BY) == MANAGED_BY:
        raw = {"type": event.type, "object": event.obj}
        await handlers.rayjob_event(event=raw, namespace=namespace, name=meta["name"], labels=labels)  # type: ignore[arg-type]
    elif event.kind == POD and LABEL_JOB in labels:
        await handlers.pod_event(namespace=namespace, labels=labels)
    elif event.kind == QUOTA:
        await handlers.quota_event(namespace=namespace)


def one_gpu_job() -> Harness:
    """A harness with one 8-GPU node and job `job-a` (the example's 8-GPU spec) applied."""
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a")
    return h
