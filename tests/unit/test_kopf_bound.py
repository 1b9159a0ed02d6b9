"""pyproject.toml caps kopf below its next minor release, because operator/rljob_operator/kopf_toggles.py
replaces methods of a private kopf class (kopf._cogs.aiokits.aiotoggles.ToggleSet) written for the kopf
installed here. The cap must admit the installed kopf and nothing newer than its minor: raising it is
done by installing the new minor, running test_operator_kopf_toggles.py (and the e2e tests) on it, and
moving the cap one minor up. This test fails when the cap is missing, looser than that, or excludes
the kopf that is installed."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def kopf_requirement() -> Requirement:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    (req,) = [Requirement(r) for r in extras["operator"] if Requirement(r).name == "kopf"]
    return req


def next_minor(v: Version) -> Version:
    return Version(f"{v.major}.{v.minor + 1}.0")


def bound_problems(spec: SpecifierSet, installed: Version) -> list[str]:
    """What is wrong with kopf's version specifier `spec` given the installed kopf (pure)."""
    problems = []
    if not spec.contains(installed, prereleases=True):
        problems.append(
            f"the installed kopf {installed} is outside pyproject.toml's {spec}: reinstall (make venv)"
        )
    newer = next_minor(installed)
    if spec.contains(newer, prereleases=True) or spec.contains(f"{newer}rc1", prereleases=True):
        problems.append(
            f"pyproject.toml's kopf{spec} admits kopf {newer}, which kopf_toggles.py was not checked against "
            f"(it patches kopf's private ToggleSet): cap it at <{newer.major}.{newer.minor}, or install "
            f"kopf {newer.major}.{newer.minor}, check kopf_toggles.py against it and cap one minor higher"
        )
    return problems


def test_the_kopf_cap_admits_the_installed_kopf_and_not_its_next_minor() -> None:
    problems = bound_problems(kopf_requirement().specifier, Version(version("kopf")))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("spec", "installed", "wrong"),
    [
        (">=1.44,<1.46", "1.45.2", []),
        (">=1.44,<1.46", "1.45.0", []),
        (">=1.44", "1.45.2", ["admits kopf 1.46.0"]),  # no cap at all
        (">=1.44,<2", "1.45.2", ["admits kopf 1.46.0"]),  # a cap that lets the next minor in
        (">=1.44,<1.47", "1.45.2", ["admits kopf 1.46.0"]),  # raised without installing the new minor
        (">=1.44,<1.46", "1.46.0", ["outside"]),  # a newer kopf installed by hand
        (">=1.44,<1.47", "1.46.1", []),  # the cap moved with the kopf it was checked on
        ("<=1.46", "1.45.2", ["admits kopf 1.46.0"]),
    ],
)
def test_the_check_tells_a_guarding_cap_from_one_that_does_not_guard(
    spec: str, installed: str, wrong: list[str]
) -> None:
    problems = bound_problems(SpecifierSet(spec), Version(installed))
    assert len(problems) == len(wrong), problems
    for problem, words in zip(problems, wrong, strict=True):
        assert words in problem
