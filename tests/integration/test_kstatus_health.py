"""Flux's verdict on the operator's real status shapes, from Flux's own code (gitops/kstatus-check):
kstatus' status.Compute, what kustomize-controller uses for `wait: true` and `healthChecks`, and the
status reader it builds from the healthCheckExprs in gitops/flux/kustomization.yaml.

The first run builds the Go program (2-4 minutes on 2 cores with empty Go caches); later runs
use ~/.cache/rljob/bin/kstatus-check-<version>/ and take well under a second."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "gitops" / "argocd" / "resource_customizations" / "rljob.dev" / "RLTrainingJob" / "testdata"
KUSTOMIZATION = REPO / "gitops" / "flux" / "kustomization.yaml"

# testdata case -> (kstatus alone, with the healthCheckExprs)
EXPECTED = {
    # kstatus calls an object with no status at all Current; the operator writes Pending on its
    # first visit, and the healthCheckExprs cannot be evaluated without status (Flux keeps waiting).
    "no-status": ("Current", "Unknown"),
    "pending": ("InProgress", "InProgress"),
    "queued-quota": ("InProgress", "Current"),
    "queued-kueue": ("InProgress", "Current"),
    "starting": ("InProgress", "InProgress"),
    "retrying": ("InProgress", "InProgress"),
    "running-first-step": ("Current", "Current"),
    "running": ("Current", "Current"),
    "stale-generation": ("InProgress", "InProgress"),
    "suspended": ("Current", "Current"),
    "succeeded": ("Current", "Current"),
    "failed": ("Failed", "Failed"),
    "failed-name-too-long": ("Failed", "Failed"),
    "stalled-secret-missing": ("Failed", "Failed"),
}


def _kstatus_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kstatus_check", REPO / "gitops" / "kstatus_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, Any]]:
    tool = _kstatus_check()
    if not tool.binary().path.exists():
        try:
            tool.devbuild.go_binary()
        except tool.HarnessError as exc:
            pytest.skip(str(exc))
    results = tool.check(sorted(TESTDATA.glob("*.yaml")), KUSTOMIZATION)
    return {Path(r["file"]).stem: r for r in results}


def test_every_case_is_judged(verdicts: dict[str, dict[str, Any]]) -> None:
    assert set(verdicts) == set(EXPECTED)


@pytest.mark.parametrize("case", EXPECTED)
def test_kstatus_and_health_check_exprs(case: str, verdicts: dict[str, dict[str, Any]]) -> None:
    result = verdicts[case]
    assert (result["status"], result.get("exprs")) == EXPECTED[case], result


def test_kstatus_messages_are_the_operators(verdicts: dict[str, dict[str, Any]]) -> None:
    """What `flux get kustomizations` shows for a failed or stuck job: the operator's own words."""
    assert verdicts["stalled-secret-missing"]["message"].startswith("Secret 'hf-token'")
    assert "CUDA out of memory" in verdicts["failed"]["message"]
    assert verdicts["queued-quota"]["message"].startswith("needs 8 nvidia.com/gpu")
    stale = verdicts["stale-generation"]["message"]
    assert stale == "RLTrainingJob generation is 2, but latest observed generation is 1"
