"""The watch caches (watch_cache.py): kopf's indices, slimmed to what the operator reads, serve the
reconciler's list calls once a handler has handed them over; before that the lists go to the API
server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rljob_operator.checks import NodeInfo
from rljob_operator.kube import Kube
from rljob_operator.watch_cache import (
    INDICES,
    JOBS,
    NODES,
    PODS,
    QUOTAS,
    RAYJOBS,
    CachedKube,
    WatchCaches,
    selected,
    slim_job,
    slim_node,
    slim_pod,
    slim_quota,
    slim_rayjob,
)

MANAGED = {"managed-by": "me"}


def _meta(name: str, namespace: str = "ml", **labels: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "uid": f"u-{name}", "labels": labels}


POD = {
    "metadata": {
        **_meta("job-a-head", **{"rljob.dev/job": "job-a"}),
        "managedFields": [{"manager": "kubelet"}] * 20,
        "creationTimestamp": "2026-11-26T10:00:00Z",
    },
    "spec": {
        "containers": [
            {
                "name": "ray-head",
                "image": "x",
                "env": [{"name": "A"}],
                "resources": {"requests": {"cpu": "2"}},
            }
        ],
        "volumes": [{"name": "dshm"}],
        "nodeName": "cpu-0",
    },
    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]},
}


def _caches(**index: dict[Any, list[dict[str, Any]]]) -> WatchCaches:
    caches = WatchCaches()
    caches.capture({name: index.get(name, {}) for name in INDICES} | {"logger": None})
    return caches


def test_slim_objects_keep_what_the_operator_reads_and_drop_the_rest() -> None:
    pod = slim_pod(POD)
    assert "managedFields" not in pod["metadata"] and "volumes" not in pod["spec"]
    assert pod["spec"]["containers"] == [{"name": "ray-head", "resources": {"requests": {"cpu": "2"}}}]
    assert pod["status"] == POD["status"] and pod["metadata"]["creationTimestamp"] == "2026-11-26T10:00:00Z"
    owners = [{"uid": "u1", "controller": True}]
    full = {
        "metadata": {**_meta("job-a"), "generation": 2, "resourceVersion": "7", "ownerReferences": owners},
        "spec": {"suspend": True, "entrypoint": "x" * 1000, "rayClusterSpec": {"headGroupSpec": {}}},
        "status": {"jobDeploymentStatus": "Running", "rayClusterStatus": {"readyWorkerReplicas": 1}},
    }
    rayjob = slim_rayjob({**full, "metadata": {**full["metadata"], "managedFields": [{}] * 3}})
    assert rayjob == {**full, "spec": {"suspend": True}}  # what a pass reads; not the pod templates
    quota = slim_quota(
        {"metadata": _meta("q"), "spec": {"hard": {}}, "status": {"hard": {"a": "1"}, "used": {}}}
    )
    assert quota["status"] == {"hard": {"a": "1"}, "used": {}}
    node = slim_node(
        {"metadata": _meta("n", ""), "spec": {"taints": []}, "status": {"allocatable": {"g": "8"}}}
    )
    assert node["status"] == {"allocatable": {"g": "8"}} and node["spec"] == {}
    job = slim_job(
        {"metadata": {**_meta("j"), "generation": 2}, "spec": {"a": 1}, "status": {"phase": "Running"}}
    )
    assert job["metadata"]["generation"] == 2 and job["status"] == {"phase": "Running"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("a", True),
        ("!a", False),
        ("a=1", True),
        ("a==1", True),
        ("a!=1", False),
        ("a=1,b", False),
        ("", True),
    ],
)
def test_equality_selectors(selector: str, expected: bool) -> None:
    assert selected({"a": "1"}, selector) is expected


def test_nothing_is_served_before_a_handler_hands_every_index_over() -> None:
    caches = WatchCaches()
    caches.capture({JOBS: {}, "logger": None})  # a handler without the indices (there are none yet)
    assert not caches.ready
    caches.capture({name: {} for name in INDICES})
    assert caches.ready


LISTS = ("list_jobs", "list_rayjobs", "list_pods", "list_quotas", "list_nodes")


@pytest.fixture
def api_lists(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The list calls that reach the API server (Kube's own, which CachedKube falls back to)."""
    called: list[str] = []
    for method in LISTS:

        async def listed(*_: Any, _name: str = method, **__: Any) -> list[Any]:
            called.append(_name)
            return []

        monkeypatch.setattr(Kube, method, listed)
    return called


def _run(caches: WatchCaches, use: Any) -> Any:
    async def main() -> Any:
        kube = CachedKube(caches)
        try:
            return await use(kube)
        finally:
            await kube.close()

    return asyncio.run(main())


async def _every_list(kube: CachedKube) -> list[Any]:
    return [
        await kube.list_jobs("ml"),
        await kube.list_rayjobs("ml", "a=b"),
        await kube.list_pods("ml", "a"),
        await kube.list_quotas("ml"),
        await kube.list_nodes(),
    ]


def test_before_the_handover_every_list_goes_to_the_api_server(api_lists: list[str]) -> None:
    _run(WatchCaches(), _every_list)
    assert api_lists == list(LISTS)


def test_lists_are_served_from_the_indices_sorted_and_filtered(api_lists: list[str]) -> None:
    job_pod = slim_pod(POD)
    other_pod = slim_pod({**POD, "metadata": _meta("job-b-head", **{"rljob.dev/job": "job-b"})})
    caches = _caches(
        **{
            PODS: {  # keyed by (namespace, job), as handlers.rljob_pods keys them
                ("ml", "job-b"): [other_pod],
                ("ml", "job-a"): [job_pod],
                ("other", "job-a"): [
                    slim_pod({**POD, "metadata": _meta("x", "other", **{"rljob.dev/job": "job-a"})})
                ],
            },
            RAYJOBS: {  # keyed by (namespace, name), as handlers.rljob_rayjobs keys them
                ("ml", "job-a"): [slim_rayjob({"metadata": _meta("job-a", **MANAGED), "spec": {}})]
            },
            QUOTAS: {"ml": [slim_quota({"metadata": _meta("gpus"), "status": {"hard": {"g": "8"}}})]},
            NODES: {
                None: [
                    slim_node({"metadata": _meta("gpu-0", ""), "status": {"allocatable": {"g": "8"}}}),
                    slim_node({"metadata": _meta("gpu-1", ""), "spec": {"unschedulable": True}}),
                ]
            },
            JOBS: {  # keyed by (namespace, name), as handlers.rljob_jobs keys them
                ("ml", "job-a"): [slim_job({"metadata": _meta("job-a"), "spec": {}})],
                ("team", "t"): [slim_job({"metadata": _meta("t", "team")})],
            },
        }
    )

    async def use(kube: CachedKube) -> Any:
        return (
            await kube.list_pods("ml", "rljob.dev/job=job-a"),
            await kube.list_pods("ml", "rljob.dev/job"),
            await kube.list_pods("ml", "rljob.dev/job=job-a,rljob.dev/role=head"),
            await kube.list_rayjobs("ml", "managed-by=me"),
            await kube.list_rayjobs("ml", "managed-by=else"),
            await kube.list_quotas("ml"),
            await kube.list_quotas("empty"),
            await kube.list_nodes(),
            await kube.list_jobs(None),
            await kube.list_jobs("team"),
        )

    (pods_a, pods, head, rayjobs, none, quotas, no_quotas, nodes, jobs, team) = _run(caches, use)
    assert api_lists == []  # no list call reached the API server
    assert [p["metadata"]["name"] for p in pods_a] == ["job-a-head"]
    assert [p["metadata"]["name"] for p in pods] == ["job-a-head", "job-b-head"]
    assert head == []  # a selector beyond the job's label is matched, not looked up (no role label here)
    assert [r["metadata"]["name"] for r in rayjobs] == ["job-a"] and none == []
    assert [q["metadata"]["name"] for q in quotas] == ["gpus"] and no_quotas == []
    assert nodes == [NodeInfo("gpu-0", {}, {"g": "8"})]
    assert [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs] == [
        ("ml", "job-a"),
        ("team", "t"),
    ]
    assert [j["metadata"]["name"] for j in team] == ["t"]
    # The cached objects themselves, not copies (callers only read them: the reconciler tests' FakeKube
    # hands out read-only objects to hold it to that).
    assert caches.items(PODS, "ml")[0] is pods_a[0]
    kube = CachedKube.__new__(CachedKube)  # cached_job touches no client
    kube.caches = caches
    assert kube.cached_job("team", "t")[1] is caches.items(JOBS, "team")[0]
    assert kube.cached_job("team", "job-a") == (True, None) == kube.cached_job("ml", "t")
    assert kube.cached_rayjob("ml", "job-a") == (True, rayjobs[0])
    assert kube.cached_rayjob("team", "job-a") == (True, None)  # known: there is none


def test_no_job_is_read_from_the_cache_before_the_handover() -> None:
    kube = CachedKube.__new__(CachedKube)
    kube.caches = WatchCaches()
    assert kube.cached_job("ml", "job-a") == (False, None)  # not known: the reconciler reads it
    assert kube.cached_rayjob("ml", "job-a") == (False, None)  # not known: read it
