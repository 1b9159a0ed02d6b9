"""Names KubeRay would refuse for the RayJob (longer than 47 characters, or not a DNS-1035 label) are
refused at admission by the CRD's root rules, with the advice the operator's check_name gives jobs
created before the rules existed; `rljob-runtime validate` says the same."""

from __future__ import annotations

import celpy
import pytest
from operator_fixtures import job_from_spec

from rljob_api.crdgen import build_crd
from rljob_api.metadata import metadata_problems
from rljob_api.resource import NAME_FORM_VALIDATION, NAME_MAX, NAME_VALIDATION, name_problem, name_problems
from rljob_operator.checks import check_name


def _root_rules() -> list[dict[str, str]]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root["properties"]["metadata"]["properties"]["name"]["maxLength"] == 253  # bounds CEL's cost
    return root["x-kubernetes-validations"]


def _cel_failures(name: str) -> list[str]:
    env = celpy.Environment()
    doc = celpy.json_to_cel({"metadata": {"name": name}, "spec": {}})
    return [
        rule["message"]
        for rule in _root_rules()
        if not bool(env.program(env.compile(rule["rule"])).evaluate({"self": doc}))
    ]


NAMES = [
    "a",
    "qwen-math",
    "a" * NAME_MAX,
    "a" * (NAME_MAX + 1),
    "a" * 63,
    "1st-run",  # a DNS-1123 subdomain the API server takes, not a DNS-1035 label
    "9",
    "qwen.math",
    "qwen-math-",
    "-qwen",
    "Qwen",
    "x" * 40 + ".v2",
    "qwen-math\n",  # RE2's '$' is the end of the text
]


@pytest.mark.parametrize("name", NAMES)
def test_the_crd_and_python_agree_on_names(name: str) -> None:
    assert _cel_failures(name) == name_problems(name)


def test_the_root_rules_name_the_field_and_refuse_what_kuberay_refuses() -> None:
    assert _root_rules() == [NAME_VALIDATION, NAME_FORM_VALIDATION]
    assert all(rule["fieldPath"] == ".metadata.name" for rule in _root_rules())
    assert name_problems("1st-run") == [NAME_FORM_VALIDATION["message"]]
    assert name_problems("qwen.math") == [NAME_FORM_VALIDATION["message"]]
    assert name_problem("a" * (NAME_MAX + 1)) == NAME_VALIDATION["message"]
    assert name_problem("qwen-math") is None


def test_validate_says_what_the_api_server_says() -> None:
    assert metadata_problems({"name": "1st-run"}) == [
        f"metadata.name: Invalid value: '1st-run': {NAME_FORM_VALIDATION['message']}"
    ]


def test_check_name_gives_the_same_advice_for_older_jobs() -> None:
    blocker = check_name(job_from_spec(name="a" * (NAME_MAX + 1)))
    assert blocker is not None and blocker.terminal
    advice = str(NAME_VALIDATION["message"]).removeprefix(f"the name has more than {NAME_MAX}")
    assert blocker.message.endswith(advice)
    form = check_name(job_from_spec(name="job.v2"))
    assert form is not None and form.terminal and form.reason == "InvalidName"
    assert form.message == f"'job.v2': {NAME_FORM_VALIDATION['message']}"
    assert check_name(job_from_spec(name="job-v2")) is None
