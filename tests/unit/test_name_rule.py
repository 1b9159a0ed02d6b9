"""A name longer than the RayJob allows is refused at admission by the CRD's root rule, with the
advice the operator's check_name gives jobs created before the rule existed."""

from __future__ import annotations

import celpy
from operator_fixtures import job_from_spec

from rljob_api.crdgen import build_crd
from rljob_api.resource import NAME_MAX, name_problem
from rljob_operator.checks import check_name


def _root_rule() -> dict[str, str]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = root["x-kubernetes-validations"]
    assert root["properties"]["metadata"]["properties"]["name"]["maxLength"] == 253  # bounds CEL's cost
    return rule


def test_the_crd_refuses_names_longer_than_the_rayjob_allows() -> None:
    rule = _root_rule()
    env = celpy.Environment()
    program = env.program(env.compile(rule["rule"]))
    for length in (1, NAME_MAX, NAME_MAX + 1, 63):
        doc = celpy.json_to_cel({"metadata": {"name": "a" * length}, "spec": {}})
        assert bool(program.evaluate({"self": doc})) == (name_problem("a" * length) is None), length
    assert rule["fieldPath"] == ".metadata.name"
    assert rule["message"] == name_problem("a" * (NAME_MAX + 1))


def test_check_name_gives_the_same_advice_for_older_jobs() -> None:
    blocker = check_name(job_from_spec(name="a" * (NAME_MAX + 1)))
    assert blocker is not None and blocker.terminal
    advice = _root_rule()["message"].removeprefix(f"the name has more than {NAME_MAX}")
    assert blocker.message.endswith(advice)
