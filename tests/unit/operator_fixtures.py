"""Helpers for operator unit tests: jobs as the API server would hand them over."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from rljob_operator.job import Job, job_from_object

from spec_cases import BASE_SPEC, patched

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "manifests"
NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def job_from_example(name: str, **metadata: Any) -> Job:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    return _with_identity(doc, **metadata)


def job_from_spec(patch: dict[str, Any] | None = None, name: str = "job-a", **metadata: Any) -> Job:
    doc = {
        "apiVersion": "rljob.dev/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": name},
        "spec": patched(patch or {}, BASE_SPEC),
    }
    return _with_identity(doc, **metadata)


def _with_identity(doc: dict[str, Any], status: dict[str, Any] | None = None, **metadata: Any) -> Job:
    doc["metadata"] = {
        "namespace": "ml",
        "uid": f"uid-{doc['metadata']['name']}",
        "generation": 1,
        "creationTimestamp": "2026-11-22T10:00:00Z",
        **doc["metadata"],
        **metadata,
    }
    if status is not None:
        doc["status"] = status
    return job_from_object(doc)
