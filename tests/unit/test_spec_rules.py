"""Every cross-field rule and schema constraint: a failing case names the field and the rule; a
nearby valid case passes; immutable fields refuse changes, mutable ones accept them."""

from __future__ import annotations

import pytest

from rljob_api.errors import SpecError
from rljob_api.resource import check_update, name_problems, parse_spec

from spec_cases import BASE_SPEC, IMMUTABLE_CASES, MUTABLE_PATCHES, RULE_CASES, SCHEMA_CASES, Case, patched


def test_base_spec_is_valid() -> None:
    spec = parse_spec(BASE_SPEC)
    assert spec.total_gpus() == 8


@pytest.mark.parametrize("case", RULE_CASES + SCHEMA_CASES, ids=lambda c: c.name)
def test_invalid_spec_is_refused_naming_the_field(case: Case) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(patched(case.patch))
    problems = info.value.problems
    matching = [p for p in problems if p.startswith(case.path + ":")]
    assert matching, f"no problem names {case.path}: {problems}"
    assert any(case.message in p for p in matching), problems


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: c.name)
def test_nearby_valid_spec_passes(case: Case) -> None:
    parse_spec(patched(case.valid_patch))


def test_all_violations_of_one_object_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(patched({"rollout": {"batchSize": 30}, "training": {"parallelism": {"tensor": 3}}}))
    paths = [p.split(":")[0] for p in info.value.problems]
    assert paths.count("spec.training.globalBatchSize") == 1
    assert "spec.training.parallelism" in paths
    assert str(info.value).startswith("RLTrainingJob is invalid (2 problems):")


def test_misspelt_field_gets_a_suggestion() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(patched({"rollout": {"nSamplePerPrompt": 4}}))
    assert info.value.problems == [
        "spec.rollout.nSamplePerPrompt: unknown field; did you mean nSamplesPerPrompt?"
    ]


@pytest.mark.parametrize("case", IMMUTABLE_CASES, ids=lambda c: c.name)
def test_immutable_fields_refuse_changes(case: Case) -> None:
    old = parse_spec(BASE_SPEC)
    new = parse_spec(patched(case.patch))
    problems = check_update(old, new)
    assert any(p.startswith(case.path + ":") and case.message in p for p in problems), problems


@pytest.mark.parametrize("patch", MUTABLE_PATCHES, ids=lambda p: next(iter(p)))
def test_mutable_fields_accept_changes(patch: dict) -> None:
    assert check_update(parse_spec(BASE_SPEC), parse_spec(patched(patch))) == []


def test_defaults_match_slime_conventions() -> None:
    spec = parse_spec(BASE_SPEC)
    assert spec.algorithm.advantage_estimator == "grpo"
    assert spec.algorithm.eps_clip == 0.2
    assert spec.algorithm.kl_loss_type == "low_var_kl"
    assert spec.rollout.engine == "sglang" and spec.training.backend == "megatron"
    assert spec.resources.colocate is True
    assert spec.checkpoint.resume == "auto"


def test_total_gpus_by_layout() -> None:
    disaggregated = parse_spec(patched({"resources": {"colocate": False, "rollout": {"gpus": 8}}}))
    assert disaggregated.total_gpus() == 16
    cpu = parse_spec(
        patched(
            {"resources": {"device": "cpu"}, "rollout": {"engine": "hf"}, "training": {"backend": "torch"}}
        )
    )
    assert cpu.total_gpus() == 0


def test_round_trip_through_yaml_document_is_stable() -> None:
    spec = parse_spec(BASE_SPEC)
    assert parse_spec(spec.to_document()) == spec


def test_case_names_make_valid_job_names() -> None:
    """The e2e tests create each case as a job named after it ("bad-"/"ok-" + name): the CRD's name rules
    (KubeRay's 47 characters, a DNS-1035 label) apply to them."""
    refused = [
        c.name
        for c in [*RULE_CASES, *SCHEMA_CASES]
        for prefix in ("bad-", "ok-")
        if name_problems(prefix + c.name)
    ]
    assert not refused
    names = [c.name for c in RULE_CASES + SCHEMA_CASES]
    assert len(names) == len(set(names))
