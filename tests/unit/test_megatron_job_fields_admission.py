"""Admission of training.fusions and training.lmHead: valid values pass, a repeated fusion, an unknown
one and either field with training.backend torch are refused naming the field, by the pydantic models
and by the CRD's CEL rules alike (evaluated here with cel-python, as test_cel_agrees_with_python
does), and the generated CRD carries those rules and no default for the two fields (unset means the
megatron backend's default, which torch jobs must be able to leave alone)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_cel_agrees_with_python import SPEC_SCHEMA, apply_defaults, cel_failures, python_problems

from rljob_api.crdgen import build_crd
from rljob_api.errors import SpecError
from rljob_api.resource import parse_spec
from rljob_api.spec_training import DEFAULT_FUSIONS, DEFAULT_LM_HEAD, MEGATRON_FUSIONS
from rljob_api.support import unsupported

from spec_cases import patched

TORCH = {"backend": "torch", "parallelism": {"tensor": 1}}


def verdicts(patch: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(CEL failures, Python problems) of BASE_SPEC with ``patch``."""
    doc = patched(patch)
    return cel_failures(SPEC_SCHEMA, apply_defaults(SPEC_SCHEMA, copy.deepcopy(doc))), python_problems(doc)


@pytest.mark.parametrize(
    "training",
    [
        {"fusions": ["wgrad"]},
        {"fusions": []},
        {"fusions": list(MEGATRON_FUSIONS)},
        {"lmHead": "full"},
        {"lmHead": "chunked", "fusions": ["rope", "norm"], "megatronArgs": {"overlap-grad-reduce": ""}},
        TORCH,  # the torch backend with both fields unset
    ],
)
def test_valid_fields_are_admitted(training: dict[str, Any]) -> None:
    assert verdicts({"training": training}) == ([], [])


@pytest.mark.parametrize(
    ("training", "path", "message"),
    [
        (
            {**TORCH, "fusions": ["wgrad"]},
            "spec.training.fusions",
            "not supported by this runtime yet: training.fusions with training.backend torch (they are the "
            "megatron backend's model fusions); use training.backend megatron, or remove it",
        ),
        (
            {**TORCH, "fusions": []},  # even the empty list: it is a setting only megatron reads
            "spec.training.fusions",
            "training.fusions with training.backend torch",
        ),
        (
            {**TORCH, "lmHead": "full"},
            "spec.training.lmHead",
            "not supported by this runtime yet: training.lmHead with training.backend torch (it is the "
            "megatron backend's LM head); use training.backend megatron, or remove it",
        ),
        (
            {"fusions": ["norm", "wgrad", "norm"]},
            "spec.training.fusions",
            "fusions names each fusion once",
        ),
    ],
)
def test_invalid_fields_are_refused_by_cel_and_python_alike(
    training: dict[str, Any], path: str, message: str
) -> None:
    cel, py = verdicts({"training": training})
    assert cel == py, (cel, py)
    assert len(cel) == 1 and cel[0].startswith(f"{path}: ") and message in cel[0], cel


def test_the_runtime_refuses_a_torch_spec_built_in_code_with_the_same_words() -> None:
    spec = parse_spec(patched({"training": TORCH}))
    training = spec.training.model_copy(update={"fusions": ["wgrad"], "lm_head": "chunked"})
    problems = unsupported(spec.model_copy(update={"training": training}))
    assert [p.split(":")[0] for p in problems] == ["spec.training.fusions", "spec.training.lmHead"]


@pytest.mark.parametrize(
    ("training", "where"),
    [
        ({"fusions": ["fast"]}, "spec.training.fusions[0]"),
        ({"fusions": ["wgrad", "wgrad", "norm", "rope", "swiglu"]}, "spec.training.fusions"),
        ({"lmHead": "fused"}, "spec.training.lmHead"),
    ],
)
def test_schema_refuses_unknown_names_and_too_many(training: dict[str, Any], where: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(patched({"training": training}))
    assert any(p.startswith(where) for p in info.value.problems), info.value.problems


def test_the_crd_carries_the_fields_and_their_rules() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    training = schema["properties"]["training"]
    fusions, head = training["properties"]["fusions"], training["properties"]["lmHead"]
    assert fusions["items"]["enum"] == list(MEGATRON_FUSIONS) and fusions["maxItems"] == len(MEGATRON_FUSIONS)
    assert head["enum"] == ["chunked", "full"]
    assert "default" not in fusions and "default" not in head  # unset = the megatron backend's default
    root = {r["fieldPath"]: r["rule"] for r in schema["x-kubernetes-validations"]}
    assert root[".training.fusions"] == "!has(self.training.fusions) || self.training.backend == 'megatron'"
    assert root[".training.lmHead"] == "!has(self.training.lmHead) || self.training.backend == 'megatron'"
    assert any(r["fieldPath"] == ".fusions" for r in training["x-kubernetes-validations"])


def test_unset_fields_read_as_the_documented_defaults() -> None:
    training = parse_spec(patched({})).training
    assert training.fusions is None and training.lm_head is None
    assert training.megatron_fusions() == DEFAULT_FUSIONS == ("swiglu", "wgrad", "norm", "rope")
    assert DEFAULT_LM_HEAD == "chunked" and training.chunked_lm_head()
    assert "fusions" not in parse_spec(patched({})).to_document()["training"]  # nothing written back
    chosen = parse_spec(patched({"training": {"fusions": [], "lmHead": "full"}})).training
    assert chosen.megatron_fusions() == () and not chosen.chunked_lm_head()
