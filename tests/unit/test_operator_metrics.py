"""Operator metrics: per-job series with bounded labels that go away with the job, the reconciler
feeding them from status, and a Grafana dashboard that only queries metrics the operator exports."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rljob_api.status import PHASES
from rljob_operator.build import BuildSettings
from rljob_operator.election import LEADER
from rljob_operator.metrics import Metrics, sample_from_status
from rljob_operator.names import rayjob_name
from rljob_operator.reconcile import Reconciler

from spec_cases import patched

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "rljob" / "dashboards" / "rljob-operator.json"
JOB = ("ml", "qwen-math")
PROGRESS = {"step": 120, "numRollout": 3000, "rewardMean": 0.47, "updatedAt": "2026-11-22T12:00:00Z"}
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(registry: CollectorRegistry) -> Series:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def of_job(series: Series, key: tuple[str, str] = JOB) -> Series:
    job = {("namespace", key[0]), ("name", key[1])}
    return {k: v for k, v in series.items() if job <= k[1]}


def value(series: Series, name: str, key: tuple[str, str] = JOB, **labels: str) -> float | None:
    want = frozenset({("namespace", key[0]), ("name", key[1]), *labels.items()})
    return series.get((name, want))


def per_job(series: Series) -> Series:
    return {k: v for k, v in series.items() if k[0].startswith("rljob_job_")}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_per_job_series_have_the_status_values(registry: CollectorRegistry) -> None:
    Metrics(registry).observe(JOB, {"phase": "Running", "gpus": 16, "restarts": 2, "progress": PROGRESS})
    s = scrape(registry)
    assert value(s, "rljob_job_gpus") == 16
    assert value(s, "rljob_job_step") == 120
    assert value(s, "rljob_job_num_rollout") == 3000
    assert value(s, "rljob_job_reward_mean") == pytest.approx(0.47)
    assert value(s, "rljob_job_restarts_total") == 2
    assert value(s, "rljob_job_last_progress_timestamp_seconds") == 1795348800.0
    assert {p: value(s, "rljob_job_status_phase", phase=p) for p in PHASES} == {
        p: float(p == "Running") for p in PHASES
    }


def test_labels_are_bounded(registry: CollectorRegistry) -> None:
    Metrics(registry).observe(JOB, {"phase": "Running", "gpus": 16, "progress": PROGRESS})
    for name, labels in per_job(scrape(registry)):
        extra = {k: v for k, v in labels if k not in ("namespace", "name")}
        assert extra == {} or (name == "rljob_job_status_phase" and extra["phase"] in PHASES)


def test_a_phase_change_moves_the_phase_series(registry: CollectorRegistry) -> None:
    metrics = Metrics(registry)
    metrics.observe(JOB, {"phase": "Queued", "gpus": 8})
    assert value(scrape(registry), "rljob_job_status_phase", phase="Queued") == 1
    assert scrape(registry)[("rljob_operator_queued_gpus", frozenset())] == 8
    metrics.observe(JOB, {"phase": "Running", "gpus": 8})
    s = scrape(registry)
    assert value(s, "rljob_job_status_phase", phase="Queued") == 0
    assert value(s, "rljob_job_status_phase", phase="Running") == 1
    assert s[("rljob_operator_jobs", frozenset({("phase", "Running")}))] == 1
    assert s[("rljob_operator_queued_gpus", frozenset())] == 0


@pytest.mark.parametrize("reward", [None, math.nan, math.inf, "0.5", True])
def test_reward_is_absent_until_reported(registry: CollectorRegistry, reward: Any) -> None:
    metrics = Metrics(registry)
    metrics.observe(JOB, {"phase": "Starting", "gpus": 8})
    s = scrape(registry)
    assert not any(name in ("rljob_job_reward_mean", "rljob_job_step") for name, _ in of_job(s))
    metrics.observe(JOB, {"phase": "Running", "gpus": 8, "progress": {"step": 1, "rewardMean": reward}})
    s = scrape(registry)
    assert value(s, "rljob_job_step") == 1
    assert value(s, "rljob_job_reward_mean") is None


def test_forget_removes_every_series_of_the_job(registry: CollectorRegistry) -> None:
    metrics = Metrics(registry)
    other = ("ml", "other")
    for phase in PHASES:  # every phase label value the job ever had
        metrics.observe(JOB, {"phase": phase, "gpus": 8, "restarts": 1, "progress": PROGRESS})
    metrics.observe(other, {"phase": "Running", "gpus": 4})
    metrics.forget(JOB)
    s = scrape(registry)
    assert of_job(s) == {}
    assert value(s, "rljob_job_gpus", key=other) == 4
    assert sum(v for (n, _), v in s.items() if n == "rljob_operator_jobs") == 1


def test_a_thousand_deleted_jobs_leave_no_series(registry: CollectorRegistry) -> None:
    metrics = Metrics(registry)
    keys = [(f"ns-{i % 10}", f"job-{i}") for i in range(1000)]
    for i, key in enumerate(keys):
        metrics.observe(key, {"phase": PHASES[i % len(PHASES)], "gpus": 8, "progress": PROGRESS})
    assert len(per_job(scrape(registry))) == 1000 * (len(PHASES) + 6)
    for key in keys:
        metrics.forget(key)
    s = scrape(registry)
    assert per_job(s) == {}
    aggregates = ("rljob_operator_jobs", "rljob_operator_queued_gpus")
    assert all(v == 0 for (n, _), v in s.items() if n in aggregates)


def test_one_registry_holds_one_set_of_job_metrics(registry: CollectorRegistry) -> None:
    Metrics(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Metrics(registry)


def test_sample_from_status() -> None:
    sample = sample_from_status({"phase": "Running", "gpus": 16, "progress": PROGRESS})
    assert (sample.phase, sample.gpus, sample.step, sample.num_rollout) == ("Running", 16, 120, 3000)
    assert (sample.reward_mean, sample.restarts) == (0.47, 0)
    bare = sample_from_status({"progress": {"updatedAt": "yesterday"}})
    assert (bare.phase, bare.gpus, bare.step, bare.reward_mean, bare.last_progress) == (None, 0) + (None,) * 3


class FakeKube:
    """The calls one pass over a Running job makes; lists are empty and the status patch recorded."""

    def __init__(self, job: dict[str, Any], rayjob: dict[str, Any]) -> None:
        self.job, self.rayjob = job, rayjob
        self.patched: list[dict[str, Any]] = []

    def cached_job(self, namespace: str, name: str) -> tuple[bool, None]:
        return False, None  # no watch cache: the job is read with get_job

    def cached_rayjob(self, namespace: str, name: str) -> tuple[bool, None]:
        return False, None  # nor the RayJob: get_rayjob

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.job

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any]:
        return self.rayjob

    async def apply(self, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self.rayjob if obj.get("kind") == "RayJob" else obj

    async def apply_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patched.append(status)
        return status

    def __getattr__(self, name: str) -> Any:
        async def empty(*_: Any, **__: Any) -> Any:
            return [] if name.startswith("list_") else None

        return empty


def test_the_reconciler_passes_progress_from_the_status(registry: CollectorRegistry) -> None:
    job = {
        "apiVersion": "rljob.dev/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": JOB[1], "namespace": JOB[0], "uid": "u1", "generation": 1},
        "spec": patched({}),
        "status": {"phase": "Running", "progress": PROGRESS},
    }
    rayjob = {
        "metadata": {"name": rayjob_name(JOB[1])},
        "spec": {"suspend": False},
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 1},
    }
    metrics = Metrics(registry)
    kube: Any = FakeKube(job, rayjob)
    reconciler = Reconciler(kube, BuildSettings(), metrics, lambda *_: None)
    asyncio.run(reconciler.reconcile(*JOB))
    s = scrape(registry)
    assert s[("rljob_operator_reconcile_total", frozenset({("result", "ok")}))] == 1
    assert value(s, "rljob_job_status_phase", phase="Running") == 1
    assert value(s, "rljob_job_step") == 120
    assert value(s, "rljob_job_reward_mean") == pytest.approx(0.47)
    assert value(s, "rljob_job_gpus") == 8
    assert value(s, "rljob_job_restarts_total") == 1


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 39
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert variables["namespace"]["definition"] == "label_values(rljob_job_gpus, namespace)"
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in board["panels"])
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_the_dashboard_only_queries_exported_metrics(registry: CollectorRegistry) -> None:
    metrics = Metrics(registry)
    metrics.observe(JOB, {"phase": "Running", "gpus": 16, "restarts": 1, "progress": PROGRESS})
    metrics.reconciles.labels(result="ok").inc()
    metrics.duration.observe(0.1)
    exported = {name for name, _ in scrape(registry)}
    used = {m for expr in dashboard_queries() for m in re.findall(r"\brljob_[a-z0-9_]+", expr)}
    assert used and used <= exported, used - exported
    assert all(re.search(r"\brljob_", expr) for expr in dashboard_queries())


def test_the_docs_list_every_exported_metric(registry: CollectorRegistry) -> None:
    Metrics(registry)
    # Counters are documented by their sample name, with _total.
    exported = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    exported |= {m.name for m in LEADER.describe()}  # election.py's gauge, in the default registry
    text = (DASHBOARD.parents[3] / "docs" / "operator.md").read_text()
    assert {m for m in re.findall(r"`(rljob_(?:job|operator)_[a-z_]+)`", text)} == exported
