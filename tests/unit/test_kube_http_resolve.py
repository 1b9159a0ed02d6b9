"""The e2e tests' HTTP reads resolve resource names as kubectl does (tests/e2e/kube_http.py)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e.kube_http import Resource, matching_resource, resource_for_kind, without_managed_fields


def res(
    name: str, kind: str, namespaced: bool = True, short: tuple[str, ...] = (), singular: str = ""
) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "namespaced": namespaced,
        "shortNames": list(short),
        "singularName": singular,
    }


DISCOVERY = [
    (
        "v1",
        [
            res("pods", "Pod", short=("po",), singular="pod"),
            res("pods/log", "Pod"),
            res("events", "Event", short=("ev",), singular="event"),
            res("namespaces", "Namespace", namespaced=False, short=("ns",)),  # no singularName
        ],
    ),
    ("events.k8s.io/v1", [res("events", "Event", short=("ev",), singular="event")]),
    ("ray.io/v1", [res("rayjobs", "RayJob", singular="rayjob")]),
    (
        "rljob.dev/v1alpha1",
        [res("rltrainingjobs", "RLTrainingJob", short=("rljob", "rljobs"), singular="rltrainingjob")],
    ),
]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("pods", Resource("v1", "pods", True)),
        ("pod", Resource("v1", "pods", True)),
        ("po", Resource("v1", "pods", True)),
        ("Pod", Resource("v1", "pods", True)),
        ("namespace", Resource("v1", "namespaces", False)),  # by Kind when discovery gives no singular
        ("events", Resource("v1", "events", True)),  # the core group first, as kubectl
        ("events.events.k8s.io", Resource("events.k8s.io/v1", "events", True)),
        ("rayjob", Resource("ray.io/v1", "rayjobs", True)),
        ("rayjobs.ray.io", Resource("ray.io/v1", "rayjobs", True)),
        ("rljob", Resource("rljob.dev/v1alpha1", "rltrainingjobs", True)),
        ("rljobs", Resource("rljob.dev/v1alpha1", "rltrainingjobs", True)),
        ("rltj", None),  # not a name the CRD declares (kubectl refuses it too)
        ("log", None),  # subresources are not resources
        ("rayjob.rljob.dev", None),
    ],
)
def test_kinds_resolve_like_kubectl(kind: str, expected: Resource | None) -> None:
    assert matching_resource(kind, DISCOVERY) == expected


def test_paths_name_the_namespace_only_for_namespaced_resources() -> None:
    assert Resource("v1", "pods", True).path("ns1", "p") == "/api/v1/namespaces/ns1/pods/p"
    assert Resource("v1", "namespaces", False).path("ns1", "x") == "/api/v1/namespaces/x"
    assert Resource("ray.io/v1", "rayjobs", True).path("a") == "/apis/ray.io/v1/namespaces/a/rayjobs"


def test_reads_hide_managed_fields_as_kubectl_does() -> None:
    obj = {"metadata": {"name": "x", "managedFields": [{"manager": "kubectl"}]}, "spec": {}}
    assert without_managed_fields(obj) == {"metadata": {"name": "x"}, "spec": {}}


@pytest.mark.parametrize(
    ("api_version", "kind", "expected"),
    [
        ("v1", "Pod", Resource("v1", "pods", True)),
        ("v1", "Event", Resource("v1", "events", True)),
        ("events.k8s.io/v1", "Event", Resource("events.k8s.io/v1", "events", True)),
        ("rljob.dev/v1alpha1", "RLTrainingJob", Resource("rljob.dev/v1alpha1", "rltrainingjobs", True)),
        ("ray.io/v1", "RLTrainingJob", None),  # the Kind of another group
        ("v1", "pod", None),  # an object's Kind is exact
    ],
)
def test_an_objects_kind_finds_its_resource(api_version: str, kind: str, expected: Resource | None) -> None:
    assert resource_for_kind(api_version, kind, DISCOVERY) == expected
