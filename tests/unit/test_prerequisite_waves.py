"""The prerequisites are applied in waves the API server accepts: a RoleBinding only after its Role
(an identity without `bind` may bind a Role only once the API server can read it)."""

from __future__ import annotations

from operator_fixtures import job_from_example

from rljob_operator.build import BuildSettings, build_prerequisites, prerequisite_waves


def test_role_bindings_come_after_everything_else() -> None:
    job = job_from_example("grpo-cpu-demo.yaml")
    children = build_prerequisites(job, BuildSettings())
    waves = prerequisite_waves(children)
    kinds = [[c["kind"] for c in wave] for wave in waves]
    assert kinds == [["ServiceAccount", "Role", "NetworkPolicy"], ["RoleBinding"]], kinds
    assert sorted(c["metadata"]["name"] + c["kind"] for w in waves for c in w) == sorted(
        c["metadata"]["name"] + c["kind"] for c in children
    ), "nothing lost or added"


def test_no_prerequisites_make_no_waves() -> None:
    assert prerequisite_waves([]) == []
    only = [{"kind": "NetworkPolicy", "metadata": {"name": "n"}}]
    assert prerequisite_waves(only) == [only]
