"""The Flux healthCheckExprs in gitops/flux/kustomization.yaml on the operator's real status shapes,
evaluated with cel-python in the order Flux's StatusEvaluator uses (fluxcd/pkg runtime/cel: generation
check, then inProgress, failed, current, else InProgress). Flux's own Go code gives the same verdicts in
tests/integration/test_kstatus_health.py; this is the fast check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "gitops" / "argocd" / "resource_customizations" / "rljob.dev" / "RLTrainingJob" / "testdata"
KUSTOMIZATION = REPO / "gitops" / "flux" / "kustomization.yaml"
EXPRS = yaml.safe_load(KUSTOMIZATION.read_text())["spec"]["healthCheckExprs"]
_ENV = celpy.Environment()

EXPECTED = {
    "no-status": "Unknown",  # no status to evaluate: Flux keeps waiting
    "pending": "InProgress",
    "queued-quota": "Current",
    "queued-kueue": "Current",
    "converting": "InProgress",
    "converting-failed": "Failed",
    "starting": "InProgress",
    "retrying": "InProgress",
    "running-first-step": "Current",
    "running": "Current",
    "stale-generation": "InProgress",
    "suspended": "Current",
    "succeeded": "Current",
    "exporting": "InProgress",
    "exported": "Current",
    "export-failed": "Failed",
    "failed": "Failed",
    "failed-name-too-long": "Failed",
    "stalled-secret-missing": "Failed",
}


def flux_status(obj: dict[str, Any], exprs: dict[str, str]) -> str:
    observed = (obj.get("status") or {}).get("observedGeneration")
    if isinstance(observed, int) and observed != obj["metadata"].get("generation"):
        return "InProgress"
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    for key, verdict in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if key in exprs:
            try:
                result = _ENV.program(_ENV.compile(exprs[key])).evaluate(activation)
            except celpy.CELEvalError:
                return "Unknown"  # the status reader reports an evaluation error as Unknown
            if result:
                return verdict
    return "InProgress"


def test_one_entry_for_rljobs() -> None:
    assert [(e["apiVersion"], e["kind"]) for e in EXPRS] == [("rljob.dev/v1alpha1", "RLTrainingJob")]


def test_every_testdata_object_is_judged() -> None:
    assert {p.stem for p in TESTDATA.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("case", EXPECTED)
def test_health_check_exprs(case: str) -> None:
    obj = yaml.safe_load((TESTDATA / f"{case}.yaml").read_text())
    assert flux_status(obj, EXPRS[0]) == EXPECTED[case]


def test_docs_show_the_tested_exprs() -> None:
    text = KUSTOMIZATION.read_text()
    block = text[text.index("  healthCheckExprs:") :]
    assert block in (REPO / "docs" / "gitops.md").read_text()
