"""spec.resources.affinity: core/v1 Affinity typed field by field, so the API server refuses what
pod validation would refuse (tests/spec_cases_pods.py holds the refused cases), and what it accepts
reaches the pods exactly as written."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from operator_fixtures import job_from_spec

from rljob_api import spec_affinity
from rljob_api.crdgen import build_crd
from rljob_api.resource import parse_spec
from rljob_operator.build import BuildSettings, build_rayjob

from spec_cases import patched

# The example of the Kubernetes documentation ("Assigning Pods to Nodes"), plus pod anti-affinity.
DOCS_AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "topology.kubernetes.io/zone",
                            "operator": "In",
                            "values": ["antarctica-east1", "antarctica-west1"],
                        }
                    ]
                }
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "preference": {
                    "matchExpressions": [
                        {
                            "key": "another-node-label-key",
                            "operator": "In",
                            "values": ["another-node-label-value"],
                        }
                    ]
                },
            }
        ],
    },
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {
                    "matchExpressions": [{"key": "security", "operator": "In", "values": ["S1"]}]
                },
                "topologyKey": "topology.kubernetes.io/zone",
            }
        ]
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"security": "S2"}},
                    "namespaces": ["team-a"],
                    "topologyKey": "kubernetes.io/hostname",
                    "matchLabelKeys": ["rljob.dev/job"],
                },
            }
        ]
    },
}

# Each model and the client's class of the same core/v1 (or meta/v1) type.
MIRRORS = [
    (spec_affinity.Affinity, client.V1Affinity),
    (spec_affinity.NodeAffinity, client.V1NodeAffinity),
    (spec_affinity.NodeSelector, client.V1NodeSelector),
    (spec_affinity.NodeSelectorTerm, client.V1NodeSelectorTerm),
    (spec_affinity.NodeSelectorRequirement, client.V1NodeSelectorRequirement),
    (spec_affinity.NodeFieldSelectorRequirement, client.V1NodeSelectorRequirement),
    (spec_affinity.PreferredSchedulingTerm, client.V1PreferredSchedulingTerm),
    (spec_affinity.PodAffinity, client.V1PodAffinity),
    (spec_affinity.PodAntiAffinity, client.V1PodAntiAffinity),
    (spec_affinity.PodAffinityTerm, client.V1PodAffinityTerm),
    (spec_affinity.WeightedPodAffinityTerm, client.V1WeightedPodAffinityTerm),
    (spec_affinity.LabelSelector, client.V1LabelSelector),
    (spec_affinity.LabelSelectorRequirement, client.V1LabelSelectorRequirement),
]


@pytest.mark.parametrize(("model", "k8s"), MIRRORS, ids=lambda m: m.__name__)
def test_models_have_the_fields_of_the_kubernetes_types(model: Any, k8s: Any) -> None:
    ours = sorted(info.alias or name for name, info in model.model_fields.items())
    assert ours == sorted(k8s.attribute_map.values())


def test_affinity_is_kept_as_written() -> None:
    spec = parse_spec(patched({"resources": {"affinity": DOCS_AFFINITY}}))
    assert spec.to_document()["resources"]["affinity"] == DOCS_AFFINITY
    cluster = build_rayjob(
        job_from_spec({"resources": {"affinity": DOCS_AFFINITY}}), BuildSettings(), suspend=False
    )["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["template"]["spec"]["affinity"] == DOCS_AFFINITY


def test_empty_affinity_adds_nothing_to_the_pods() -> None:
    cluster = build_rayjob(job_from_spec({"resources": {"affinity": {}}}), BuildSettings(), suspend=False)[
        "spec"
    ]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert "affinity" not in group["template"]["spec"]


def _walk(node: dict[str, Any], path: str = "affinity"):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_schema_types_affinity_all_the_way_down() -> None:
    """No preserve-unknown-fields: a misspelt key is refused instead of pruned."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    affinity = schema["properties"]["spec"]["properties"]["resources"]["properties"]["affinity"]
    for path, node in _walk(affinity):
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        if node.get("type") == "object":
            assert "properties" in node or "additionalProperties" in node, path
