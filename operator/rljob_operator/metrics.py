"""Prometheus metrics of the operator (served by rljob-operator --metrics-port)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from rljob_api.status import PHASES


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.reconciles = Counter(
            "rljob_operator_reconcile_total",
            "Reconcile passes by result (ok, error).",
            ["result"],
            registry=registry,
        )
        self.duration = Histogram(
            "rljob_operator_reconcile_seconds",
            "Wall time of one reconcile pass.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.jobs = Gauge("rljob_operator_jobs", "RLTrainingJobs by phase.", ["phase"], registry=registry)
        self.queued_gpus = Gauge(
            "rljob_operator_queued_gpus",
            "GPUs requested by jobs waiting in the Queued phase.",
            registry=registry,
        )
        self._seen: dict[tuple[str, str], tuple[str, int]] = {}
        self._refresh()

    def observe(self, key: tuple[str, str], phase: str, gpus: int) -> None:
        self._seen[key] = (phase, gpus)
        self._refresh()

    def forget(self, key: tuple[str, str]) -> None:
        self._seen.pop(key, None)
        self._refresh()

    def _refresh(self) -> None:
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(sum(1 for p, _ in self._seen.values() if p == phase))
        self.queued_gpus.set(sum(g for p, g in self._seen.values() if p == "Queued"))
