"""Flux's verdict on the operator's real status shapes, from Flux's own code (gitops/kstatus-check):
kstatus' status.Compute, what kustomize-controller uses for `wait: true` and `healthChecks`, and the
status reader it builds from the healthCheckExprs in gitops/flux/kustomization.yaml.

The first run builds the Go program (2-4 minutes on 2 cores with empty Go caches); later runs
use ~/.cache/rljob/bin/kstatus-check-<version>/ and take well under a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kstatus_check
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
    "converting": ("InProgress", "InProgress"),
    "converting-failed": ("Failed", "Failed"),
    "starting": ("InProgress", "InProgress"),
    "retrying": ("InProgress", "InProgress"),
    "running-first-step": ("Current", "Current"),
    "running": ("Current", "Current"),
    "stale-generation": ("InProgress", "InProgress"),
    "suspended": ("Current", "Current"),
    "succeeded": ("Current", "Current"),
    "exporting": ("InProgress", "InProgress"),
    "exported": ("Current", "Current"),
    "export-failed": ("Failed", "Failed"),
    "failed": ("Failed", "Failed"),
    "failed-name-too-long": ("Failed", "Failed"),
    "stalled-secret-missing": ("Failed", "Failed"),
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, Any]]:
    # Builds the Go program on first use; without Go it fails with the harness's message, as the
    # e2e tests do (never a silent skip).
    results = kstatus_check.check(sorted(TESTDATA.glob("*.yaml")), KUSTOMIZATION)
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
