"""The generated CRD: fresh, structural, bounded, documented, with the names and columns users see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rljob_api import crdgen
from rljob_api.base import QUANTITY_PATTERN

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / crdgen.CRD_FILE


def _schema() -> dict[str, Any]:
    return crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_fresh() -> None:
    assert CRD_PATH.read_text() == crdgen.render(), "crds/ is stale: run `make crds`"


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    (tmp_path / crdgen.CRD_FILE).write_text(crdgen.render().replace("Lifecycle phase.", "stale"))
    assert crdgen.main(["--check", str(tmp_path)]) == 1
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert crdgen.main(["--check", str(tmp_path)]) == 0


def test_names_scope_and_subresources() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    assert crd["metadata"]["name"] == "rltrainingjobs.rljob.dev"
    names = crd["spec"]["names"]
    assert names["kind"] == "RLTrainingJob" and names["plural"] == "rltrainingjobs"
    assert names["shortNames"] == ["rljob", "rljobs"]
    assert "ml" in names["categories"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert list(columns)[:6] == ["Phase", "Reason", "Step", "Reward", "GPUs", "Age"]
    assert columns["Step"] == ".status.progress.stepText"
    # The default columns show a stuck job as stuck: the reason the operator writes on Ready.
    assert columns["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'
    defaults = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert "Reason" in defaults


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert "$ref" not in node and "allOf" not in node and "oneOf" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "title" not in node, path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{path}: anyOf only for int-or-string"
        else:
            assert "type" in node, f"{path}: every node needs a type"
        if node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "properties" in node or "additionalProperties" in node or path == ".metadata", path
        if isinstance(node.get("exclusiveMinimum"), float | int) and not isinstance(
            node["exclusiveMinimum"], bool
        ):
            raise AssertionError(f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0")


def test_every_field_has_a_description() -> None:
    undocumented = [
        path
        for path, node in _walk(_schema()["properties"]["spec"])
        if path and not path.endswith(("[]", "{}")) and not node.get("description")
    ]
    undocumented += [
        path
        for path, node in _walk(_schema()["properties"]["status"])
        if path and not path.endswith(("[]", "{}")) and not node.get("description")
    ]
    assert undocumented == []


def test_kubectl_explain_shows_every_numbers_bounds() -> None:
    """kubectl explain prints the description only: the bounds must be written there too."""
    missing = [
        path
        for path, node in _walk(_schema())
        if "description" in node and not node["description"].endswith(crdgen.bounds_sentence(node))
    ]
    assert missing == []
    batch = _schema()["properties"]["spec"]["properties"]["rollout"]["properties"]["batchSize"]
    assert batch["description"].endswith("Minimum 1, maximum 1048576.")
    assert crdgen.bounds_sentence(
        {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1}
    ) == ("Greater than 0, maximum 1.")
    assert crdgen.bounds_sentence({"type": "number", "maximum": 0.5}) == "Maximum 0.5."
    assert crdgen.bounds_sentence({"type": "string", "maxLength": 3}) == ""


def test_every_string_list_and_map_is_bounded_for_cel_cost() -> None:
    unbounded = []
    for path, node in _walk(_schema()):
        kind = node.get("type")
        if kind == "string" and not (
            {"maxLength", "enum"} & node.keys() or node.get("format") == "date-time"
        ):
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if (
            kind == "object"
            and isinstance(node.get("additionalProperties"), dict)
            and "maxProperties" not in node
        ):
            unbounded.append(path)
    assert unbounded == [".apiVersion", ".kind"]


def test_cross_field_rules_are_in_the_schema() -> None:
    spec = _schema()["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("globalBatchSize" in r and "nSamplesPerPrompt" in r for r in rules)  # batch identity
    assert any("parallelism.tensor" in r for r in rules)  # tp*pp*cp divides trainer GPUs
    resources = [r["rule"] for r in spec["properties"]["resources"]["x-kubernetes-validations"]]
    assert any("gpusPerEngine" in r for r in resources)
    assert any("self.colocate" in r and "rollout.gpus ==" in r for r in resources)
    for _, node in _walk(_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["fieldPath"].startswith(".")
            # messageExpression with string(number) breaks the API server's cost budget (k8s #124234).
            assert rule["message"] and "messageExpression" not in rule


def test_defaults_reach_nested_fields() -> None:
    spec = _schema()["properties"]["spec"]
    # Sections default to their full defaults: the API server checks a default against the
    # section's CEL rules without filling the defaults inside it.
    assert spec["properties"]["algorithm"]["default"]["advantageEstimator"] == "grpo"
    assert spec["properties"]["algorithm"]["properties"]["advantageEstimator"]["default"] == "grpo"
    assert spec["properties"]["rollout"]["properties"]["async"]["default"] == {
        "enabled": False,
        "bufferSize": 1,
        "updateWeightsInterval": 1,
    }
    assert spec["required"] == ["model", "data"]


def test_committed_api_reference_is_fresh() -> None:
    from rljob_api import docgen

    assert (REPO / "docs" / "api-reference.md").read_text() == docgen.render(), "run `make docs`"


def test_quantities_are_int_or_string_with_the_kubernetes_pattern() -> None:
    quantities = [(p, n) for p, n in _walk(_schema()) if n.get("x-kubernetes-int-or-string")]
    assert {p for p, _ in quantities} >= {
        ".spec.resources.head.memory",
        ".spec.resources.trainer.cpu",
        ".spec.resources.shmSize",
    }
    for path, node in quantities:
        assert node.get("pattern") == QUANTITY_PATTERN, path
