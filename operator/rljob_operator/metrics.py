"""Prometheus metrics of the operator (served by rljob-operator --metrics-port).

Aggregates are plain Gauges. Per-job series come from a custom collector that renders the
in-memory map of jobs at scrape time, so forgetting a job removes every one of its series at once:
no label set can be left behind after deletion, whatever label values were ever used.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rljob_api.status import PHASES

JobKey = tuple[str, str]  # (namespace, name)
JOB_LABELS = ("namespace", "name")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True)
class JobSample:
    """What the metrics show of one job; None: not reported yet, so no sample is exported."""

    phase: str | None
    gpus: int
    step: int | None = None
    num_rollout: int | None = None
    reward_mean: float | None = None
    last_progress: float | None = None  # unix seconds of status.progress.updatedAt
    restarts: int = 0


def sample_from_status(status: Mapping[str, Any]) -> JobSample:
    """The job's sample from its status: the operator's fields plus the runtime's `progress`."""
    progress = status.get("progress") or {}
    return JobSample(
        phase=status.get("phase"),
        gpus=_count(status.get("gpus")) or 0,
        step=_count(progress.get("step")),
        num_rollout=_count(progress.get("numRollout")),
        reward_mean=_finite(progress.get("rewardMean")),
        last_progress=_timestamp(progress.get("updatedAt")),
        restarts=_count(status.get("restarts")) or 0,
    )


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
        # Where a burst's latency goes: waiting for a turn, or waiting on the API server.
        self.pass_wait = Histogram(
            "rljob_operator_reconcile_wait_seconds",
            "Time a reconcile pass waited for its turn and its job's lock before starting.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.api_requests = Histogram(
            "rljob_operator_api_request_seconds",
            "Wall time of one API server request by the operator (the client call's name).",
            ["call"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.jobs = Gauge("rljob_operator_jobs", "RLTrainingJobs by phase.", ["phase"], registry=registry)
        self.queued_gpus = Gauge(
            "rljob_operator_queued_gpus",
            "GPUs requested by jobs waiting in the Queued phase.",
            registry=registry,
        )
        self.tracked_jobs = Gauge(
            "rljob_operator_tracked_jobs",
            "Jobs the operator holds per-job state for (reconcile locks, retries, metrics): "
            "0 once every job is deleted.",
            registry=registry,
        )
        # Written by the reconciler's event loop, read by the /metrics server thread. The aggregates
        # are computed at scrape time: a reconcile pass then costs O(1) here, not O(jobs).
        self._lock = threading.Lock()
        self._seen: dict[JobKey, JobSample] = {}
        self._trackers: list[Callable[[], set[JobKey]]] = []
        registry.register(_JobCollector(self._snapshot))
        for phase in PHASES:
            self.jobs.labels(phase=phase).set_function(functools.partial(self._in_phase, phase))
        self.queued_gpus.set_function(
            lambda: sum(s.gpus for s in self._snapshot().values() if s.phase == "Queued")
        )
        self.tracked_jobs.set_function(lambda: len(self.keys()))

    def observe_request(self, call: str, seconds: float) -> None:
        self.api_requests.labels(call=call).observe(seconds)

    def observe(self, key: JobKey, status: Mapping[str, Any]) -> None:
        """Record the job's status as the reconciler computed it (with the runtime's progress)."""
        sample = sample_from_status(status)
        with self._lock:
            self._seen[key] = sample

    def forget(self, key: JobKey) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def keys(self) -> set[JobKey]:
        """The jobs with per-job state: these metrics' and what `track` added (the reconciler's)."""
        with self._lock:
            return set(self._seen).union(*(f() for f in self._trackers))

    def track(self, keys: Callable[[], set[JobKey]]) -> None:
        """Count the jobs `keys()` returns in rljob_operator_tracked_jobs (called from the scrape thread:
        it must be safe to call there)."""
        self._trackers.append(keys)

    def _snapshot(self) -> dict[JobKey, JobSample]:
        with self._lock:
            return dict(self._seen)

    def _in_phase(self, phase: str) -> int:
        return sum(1 for s in self._snapshot().values() if s.phase == phase)


class _JobCollector(Collector):
    """Per-job series, labelled only by namespace and name (plus phase, one of PHASES)."""

    def __init__(self, snapshot: Callable[[], dict[JobKey, JobSample]]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return iter(_families())  # lets the registry refuse a second collector of the same names

    def collect(self) -> Iterator[Metric]:
        out = _families()
        for (namespace, name), s in sorted(self._snapshot().items()):
            job = [namespace, name]
            for p in PHASES:
                out.phase.add_metric([*job, p], 1.0 if s.phase == p else 0.0)
            out.gpus.add_metric(job, s.gpus)
            out.restarts.add_metric(job, s.restarts)
            reported = (
                (out.step, s.step),
                (out.num_rollout, s.num_rollout),
                (out.reward_mean, s.reward_mean),
                (out.last_progress, s.last_progress),
            )
            for family, value in reported:
                if value is not None:
                    family.add_metric(job, value)
        return iter(out)


class _Families(NamedTuple):
    phase: GaugeMetricFamily
    gpus: GaugeMetricFamily
    step: GaugeMetricFamily
    num_rollout: GaugeMetricFamily
    reward_mean: GaugeMetricFamily
    last_progress: GaugeMetricFamily
    restarts: CounterMetricFamily


def _families() -> _Families:
    def gauge(name: str, doc: str, *extra: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=[*JOB_LABELS, *extra])

    return _Families(
        gauge("rljob_job_status_phase", "1 for the job's current phase, 0 for the others.", "phase"),
        gauge("rljob_job_gpus", "GPUs the job requests (trainer + rollout)."),
        gauge("rljob_job_step", "Rollout steps completed, as the runtime reported."),
        gauge("rljob_job_num_rollout", "Rollout steps in the job, as the runtime reported."),
        gauge("rljob_job_reward_mean", "Mean reward of the last rollout step."),
        gauge("rljob_job_last_progress_timestamp_seconds", "When the runtime last reported progress."),
        CounterMetricFamily("rljob_job_restarts", "Times the Ray job was retried.", labels=JOB_LABELS),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _finite(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _timestamp(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return value.timestamp() if isinstance(value, datetime) and value.tzinfo else None
