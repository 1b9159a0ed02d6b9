"""The CEL rules in the CRD and the Python rules in the models must give the same verdict and the
same message. CEL is evaluated here with cel-python on documents defaulted the way the API server
defaults them (from the generated schema); the real API server's verdict is checked by the e2e tests."""

from __future__ import annotations

import copy
import functools
import json
import random
from typing import Any

import celpy
import pytest

from rljob_api.crdgen import build_crd
from rljob_api.errors import SpecError
from rljob_api.resource import parse_spec

from spec_cases import BASE_SPEC, RULE_CASES, Case, patched

SPEC_SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
_ENV = celpy.Environment()


@functools.cache
def _program(expr: str) -> celpy.Runner:
    return _ENV.program(_ENV.compile(expr))


def _eval(expr: str, node: Any) -> Any:
    return _run(expr, {"self": celpy.json_to_cel(node)})


def _run(expr: str, activation: dict[str, Any]) -> Any:
    return _program(expr).evaluate(activation)


def apply_defaults(schema: dict[str, Any], doc: Any) -> Any:
    """Structural-schema defaulting, as the API server does it: missing properties get `default`."""
    if isinstance(doc, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in doc and "default" in sub:
                doc[name] = copy.deepcopy(sub["default"])
            if name in doc:
                doc[name] = apply_defaults(sub, doc[name])
    elif isinstance(doc, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in doc]
    return doc


_VERDICTS: dict[tuple[int, str, str], list[str]] = {}


def cel_failures(schema: dict[str, Any], doc: Any, path: str = "spec") -> list[str]:
    """'path: message' for every non-transition CEL rule that fails anywhere in `doc`. Remembered per
    schema node, path and document: the random specs share most subtrees (model, checkpoint, reward),
    and cel-python's evaluation is most of this module's time (the cache saves about 40 %)."""
    key = (id(schema), path, json.dumps(doc, sort_keys=True))
    if key not in _VERDICTS:
        _VERDICTS[key] = _cel_failures(schema, doc, path)
    return list(_VERDICTS[key])


def _cel_failures(schema: dict[str, Any], doc: Any, path: str) -> list[str]:
    failures = []
    rules = [rule for rule in schema.get("x-kubernetes-validations", []) if "oldSelf" not in rule["rule"]]
    activation = {"self": celpy.json_to_cel(doc)} if rules else {}  # converted once: a third of the time
    for rule in rules:
        if not _run(rule["rule"], activation):
            message = (
                _run(rule["messageExpression"], activation)
                if "messageExpression" in rule
                else rule["message"]
            )
            failures.append(f"{path}{rule['fieldPath']}: {message}")
    if isinstance(doc, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in doc:
                failures += cel_failures(sub, doc[name], f"{path}.{name}")
    elif isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            failures += cel_failures(schema["items"], item, f"{path}[{i}]")
    return failures


def python_problems(doc: dict[str, Any]) -> list[str]:
    try:
        parse_spec(doc)
    except SpecError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: c.name)
def test_cel_and_python_agree_on_each_rule(case: Case) -> None:
    bad = patched(case.patch)
    cel = cel_failures(SPEC_SCHEMA, apply_defaults(SPEC_SCHEMA, copy.deepcopy(bad)))
    assert cel == python_problems(bad)
    assert len(cel) == 1 and cel[0].startswith(f"{case.path}: ") and case.message in cel[0]

    good = patched(case.valid_patch)
    assert cel_failures(SPEC_SCHEMA, apply_defaults(SPEC_SCHEMA, copy.deepcopy(good))) == []
    assert python_problems(good) == []


def test_defaults_from_schema_equal_pydantic_defaults() -> None:
    defaulted = apply_defaults(SPEC_SCHEMA, copy.deepcopy(BASE_SPEC))
    assert defaulted == parse_spec(BASE_SPEC).to_document()


def _random_spec(rng: random.Random) -> dict[str, Any]:
    cpu = rng.random() < 0.2
    colocate = rng.random() < 0.6
    spec = patched(
        {
            "rollout": {
                "batchSize": rng.choice([1, 4, 6, 16, 30, 32, 64]),
                "nSamplesPerPrompt": rng.choice([1, 2, 4, 8, 16]),
                "engine": "hf" if cpu or rng.random() < 0.2 else "sglang",
                "async": {"enabled": rng.random() < 0.2},
            },
            "training": {
                "backend": "torch" if cpu else "megatron",
                "globalBatchSize": rng.choice([8, 16, 32, 64, 128, 256]),
                "microBatchSize": rng.choice([1, 2, 3, 4]),
                # maxResponseLen 1024 by default: a budget of 1024 or less cannot hold the longest sample
                "dynamicBatch": {
                    "enabled": rng.random() < 0.3,
                    "maxTokensPerGpu": rng.choice([512, 1024, 1025, 1600, 16384]),
                },
                "parallelism": {}
                if cpu
                else {
                    "tensor": rng.choice([1, 2, 4]),
                    "pipeline": rng.choice([1, 2, 3]),
                    "context": rng.choice([1, 1, 1, 2]),  # above 1: not supported yet
                    "expert": rng.choice([1, 1, 1, 1, 1, 2]),  # above 1: not supported yet
                },
            },
            "resources": {
                "device": "cpu" if cpu and rng.random() < 0.9 else "cuda",
                "colocate": colocate,
                "trainer": {
                    # colocated cuda runs on one node (support.py): mostly keep to it, to reach valid specs
                    "nodes": 1 if colocate and not cpu and rng.random() < 0.8 else rng.choice([1, 2, 3, 4]),
                    "gpusPerNode": rng.choice([1, 2, 4, 8]),
                },
                "rollout": {"gpusPerEngine": rng.choice([1, 2, 4]), "gpusPerNode": rng.choice([2, 4, 8])},
            },
            "algorithm": {
                "dynamicSampling": {
                    "enabled": rng.random() < 0.3,
                    "overSamplingBatchSize": rng.choice([8, 32, 64]),
                }
            },
        }
    )
    if not colocate or rng.random() < 0.3:
        spec["resources"]["rollout"]["gpus"] = rng.choice([1, 2, 4, 8, 16])
    # dynamicBatch takes microBatchSize 1 and an hf engine one GPU: mostly keep to it, to reach valid specs
    if spec["training"]["dynamicBatch"]["enabled"] and rng.random() < 0.8:
        spec["training"]["microBatchSize"] = 1
    if spec["rollout"]["engine"] == "hf" and rng.random() < 0.8:
        spec["resources"]["rollout"]["gpusPerEngine"] = 1
    if rng.random() < 0.5:  # the longest sample is maxPromptLength + maxResponseLen when it is set
        spec["data"]["maxPromptLength"] = rng.choice([1, 512, 576])
    return spec


RANDOM_SPECS, PARTS = 1000, 4


@functools.cache
def _random_specs() -> list[dict[str, Any]]:
    rng = random.Random(20261122)
    return [_random_spec(rng) for _ in range(RANDOM_SPECS)]


@pytest.mark.parametrize("part", range(PARTS))  # the specs in parts, for the xdist workers to share
def test_cel_and_python_agree_on_random_specs(part: int) -> None:
    verdicts = {True: 0, False: 0}
    for doc in _random_specs()[part::PARTS]:
        cel = cel_failures(SPEC_SCHEMA, apply_defaults(SPEC_SCHEMA, copy.deepcopy(doc)))
        py = python_problems(doc)
        # Same verdict; Python stops at the innermost failing object, so it reports a subset.
        assert bool(cel) == bool(py), (doc, cel, py)
        assert set(py) <= set(cel), (doc, cel, py)
        verdicts[not cel] += 1
    assert min(verdicts.values()) >= 5, verdicts  # the generator exercises both outcomes


def _nodes_with_defaults(node: dict[str, Any], path: str = "spec"):
    if "default" in node:
        yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes_with_defaults(sub, f"{path}.{name}")
    if "items" in node:
        yield from _nodes_with_defaults(node["items"], f"{path}[]")


def test_every_default_passes_its_own_rules() -> None:
    """The API server refuses a CRD whose defaults break the rules beside them (CEL included)."""
    for path, node in _nodes_with_defaults(SPEC_SCHEMA):
        default = copy.deepcopy(node["default"])
        for rule in node.get("x-kubernetes-validations", []):
            if "oldSelf" not in rule["rule"]:
                assert _eval(rule["rule"], default), f"{path}: default {default} breaks {rule['rule']}"
        assert cel_failures(node, default, path) == [], path
