"""The operator-scale benchmark's latency breakdown (benchmarks/operator_scale.py), read from the
operator's real histograms between two scrapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rljob_operator.metrics import Metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from operator_scale import latency_breakdown, main


def test_the_breakdown_counts_only_what_came_between_the_scrapes() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_request("patch_namespaced_custom_object", 30.0)  # before: not counted
    before = generate_latest(registry).decode()
    for seconds in [0.02] * 98 + [0.4, 3.0]:
        metrics.observe_request("patch_namespaced_custom_object", seconds)
    metrics.pass_wait.observe(0.001)
    after = generate_latest(registry).decode()
    report = latency_breakdown(before, after)
    assert report["patch_namespaced_custom_object"] == {"count": 100.0, "p50_le_s": 0.025, "p99_le_s": 0.5}
    assert report["pass wait"] == {"count": 1.0, "p50_le_s": 0.005, "p99_le_s": 0.005}
    assert set(report) == {"patch_namespaced_custom_object", "pass wait"}  # calls never made: absent


@pytest.mark.parametrize("rate", ["0", "-5"])
def test_a_rate_that_is_not_positive_is_refused_before_anything_runs(
    rate: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["operator_scale.py", "--rate", rate])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    assert "--rate must be a positive number of jobs a second" in capsys.readouterr().err
