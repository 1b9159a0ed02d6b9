"""The support matrix (api/rljob_api/support.py): its rules sit at the spec root, each has a case the
real API server is tested with, the runtime refuses with the API server's words, and the user guide's
"What runs" section is the matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from rljob_api import support
from rljob_api.errors import SpecError
from rljob_api.resource import parse_spec
from rljob_api.spec import RLTrainingJobSpec
from rljob_api.support_doc import BEGIN, END, what_runs_markdown
from rljob_runtime.prepare import check_spec
from rljob_runtime.run_error import RunError

from spec_cases import BASE_SPEC, RULE_CASES, patched

REPO = Path(__file__).resolve().parents[2]
NOT_YET_CASES = [c for c in RULE_CASES if c.message.startswith(support.NOT_YET)]


def spec_skipping_root_rules(doc: dict[str, Any]) -> RLTrainingJobSpec:
    """A spec whose sections are validated but whose spec-wide rules are not: what a spec built or
    changed in code looks like to the runtime."""
    fields = {}
    for name, info in RLTrainingJobSpec.model_fields.items():
        alias = info.alias or name
        if alias in doc:
            section = info.annotation
            is_section = isinstance(section, type) and issubclass(section, BaseModel)
            fields[name] = section.model_validate(doc[alias]) if is_section else doc[alias]
    return RLTrainingJobSpec.model_construct(**fields)


def test_every_limit_is_a_rule_of_the_spec_root() -> None:
    root = {(r.field, r.message, r.cel) for r in RLTrainingJobSpec.rules}
    for limit in support.LIMITS:
        assert (limit.field, limit.message, limit.cel) in root, limit.field
        assert limit.message.startswith("not supported by this runtime yet: ") and "; " in limit.message


def test_every_limit_has_a_rule_case_for_the_api_server() -> None:
    """tests/e2e/test_crd.py applies RULE_CASES to a real kube-apiserver: each limit is among them."""
    covered = {(c.path, c.message) for c in NOT_YET_CASES}
    for limit in support.LIMITS:
        assert any(
            path == limit.problem().split(": ")[0] and limit.message.startswith(message)
            for path, message in covered
        ), limit.field


def test_a_supported_spec_has_nothing_unsupported() -> None:
    assert support.unsupported(parse_spec(BASE_SPEC)) == []


@pytest.mark.parametrize("case", NOT_YET_CASES, ids=lambda c: c.name)
def test_prepare_refuses_with_the_api_servers_message(case: Any) -> None:
    """The same document: the models (= the CRD's CEL, by test_cel_agrees_with_python) refuse it
    with one problem; the runtime, given it unchecked, refuses it with that very line."""
    doc = patched(case.patch)
    with pytest.raises(SpecError) as admission:
        parse_spec(doc)
    (problem,) = admission.value.problems
    spec = spec_skipping_root_rules(doc)
    assert support.unsupported(spec) == [problem]
    with pytest.raises(RunError) as runtime:
        check_spec(spec)
    assert str(runtime.value) == problem


def test_unsupported_names_every_limit_a_spec_breaks() -> None:
    doc = patched(
        {
            "training": {
                "backend": "torch",
                "megatronArgs": {"overlap-grad-reduce": ""},
                "parallelism": {"sequenceParallel": True},
            }
        }
    )
    refused = support.unsupported(spec_skipping_root_rules(doc))
    assert [p.split(":")[0] for p in refused] == [
        "spec.training.megatronArgs",
        "spec.training.parallelism.sequenceParallel",
    ]


def test_the_matrix_says_what_the_cpu_and_cuda_runs_need() -> None:
    cpu = {"resources": {"device": "cpu"}, "rollout": {"engine": "hf"}, "training": {"backend": "torch"}}
    assert support.unsupported(parse_spec(patched(cpu))) == []
    for engine, backend in (("sglang", "torch"), ("hf", "megatron")):
        doc = patched({**cpu, "rollout": {"engine": engine}, "training": {"backend": backend}})
        assert [p.split(":")[0] for p in support.unsupported(spec_skipping_root_rules(doc))] == [
            "spec.resources.device"
        ]
    for engine in support.ENGINES:  # every engine with every backend on cuda
        for backend in support.BACKENDS:
            assert (
                support.unsupported(
                    parse_spec(patched({"rollout": {"engine": engine}, "training": {"backend": backend}}))
                )
                == []
            )


def test_colocated_across_nodes_runs_on_cpu_only() -> None:
    two_nodes = {"resources": {"trainer": {"nodes": 2, "gpusPerNode": 4}}}
    cpu = {"resources": {"device": "cpu"}, "rollout": {"engine": "hf"}, "training": {"backend": "torch"}}
    assert support.unsupported(parse_spec(patched(cpu, patched(two_nodes)))) == []
    (problem,) = support.unsupported(spec_skipping_root_rules(patched(two_nodes)))
    assert problem.startswith("spec.resources.colocate: not supported by this runtime yet")


def test_the_user_guide_shows_the_matrix() -> None:
    guide = (REPO / "docs" / "user-guide.md").read_text()
    section = guide[guide.index(BEGIN) : guide.index(END) + len(END)]
    assert section == what_runs_markdown(), (
        "docs/user-guide.md is stale: run .venv/bin/python -m rljob_api.support_doc docs/user-guide.md"
    )
