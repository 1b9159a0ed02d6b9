"""The GPUS printer column (status.gpus) shows what the job's pods really request: for every layout the
spec rules admit, the GPUs of the RayJob's pod templates (per pod x replicas, head included) equal
status.gpus, and the GPU request never replaces the pods' cpu or memory (gpuResourceName is an
extended resource: spec_cases_safety has the names refused)."""

from __future__ import annotations

import itertools
from typing import Any

from operator_fixtures import NOW, job_from_spec

from rljob_api.errors import SpecError
from rljob_operator.build import BuildSettings, build_rayjob
from rljob_operator.job import Job
from rljob_operator.quantity import whole_units
from rljob_operator.status import Observed, compute_status


def _layouts() -> list[dict[str, Any]]:
    layouts = []
    grid = itertools.product(
        ("cuda", "cpu"), (True, False), (1, 2), (1, 2, 8), (None, 1, 4, 6, 8, 16), (4, 8), (1, 2)
    )
    for i, (device, colocate, nodes, per_node, rollout_gpus, rollout_per_node, per_engine) in enumerate(grid):
        name = ("nvidia.com/gpu", "amd.com/gpu")[i % 2]
        rollout: dict[str, Any] = {"gpusPerNode": rollout_per_node, "gpusPerEngine": per_engine}
        if rollout_gpus is not None:
            rollout["gpus"] = rollout_gpus
        layouts.append(
            {
                "resources": {
                    "device": device,
                    "colocate": colocate,
                    "gpuResourceName": name,
                    "trainer": {"nodes": nodes, "gpusPerNode": per_node, "cpu": 4, "memory": "64Gi"},
                    "rollout": {**rollout, "cpu": 2, "memory": "32Gi"},
                },
                "rollout": {"engine": "hf" if device == "cpu" else "sglang", "batchSize": 48},
                "training": {"backend": "torch", "globalBatchSize": 48, "microBatchSize": 1},
            }
        )
    return layouts


def _jobs() -> list[Job]:
    jobs = []
    for layout in _layouts():
        try:
            jobs.append(job_from_spec(layout))
        except SpecError:
            continue
    return jobs


def _requested(rayjob: dict[str, Any], resource: str) -> tuple[int, list[dict[str, str]]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = [(1, cluster["headGroupSpec"])] + [(g["replicas"], g) for g in cluster["workerGroupSpecs"]]
    total, requests = 0, []
    for replicas, group in groups:
        (container,) = group["template"]["spec"]["containers"]
        wanted = container.get("resources", {}).get("requests", {})
        assert wanted == container.get("resources", {}).get("limits", {})
        total += replicas * whole_units(wanted.get(resource, "0"))
        requests.append(wanted)
    return total, requests


def test_status_gpus_equal_what_the_pods_request_in_every_admitted_layout() -> None:
    jobs = _jobs()
    assert len(jobs) > 100 and {j.spec.resources.colocate for j in jobs} == {True, False}
    for job in jobs:
        rayjob = build_rayjob(job, BuildSettings(), suspend=False)
        requested, requests = _requested(rayjob, job.spec.resources.gpu_resource_name)
        status = compute_status(job, Observed(NOW))
        assert status["gpus"] == requested == job.spec.total_gpus(), job.spec.resources
        for wanted in requests[1:]:  # worker pods keep their cpu and memory beside the GPUs
            assert wanted.get("cpu") in ("4", "2") and wanted.get("memory") in ("64Gi", "32Gi"), wanted
