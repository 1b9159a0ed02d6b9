"""What a reconcile pass does, decided from the job and its RayJob (rljob_operator.plan), as a table."""

from __future__ import annotations

from typing import Any

import pytest
from operator_fixtures import job_from_spec

from rljob_operator.job import Job
from rljob_operator.plan import plan

KILLED = "Job entrypoint command failed with exit code 137, last available logs:\nstep 3/10\n"
REFUSED = (
    "Job entrypoint command failed with exit code 78, last available logs:\nrljob-runtime: failed: bad data\n"
)


def rayjob(owner: str = "uid-job-a", uid: str = "rj-1", failed: str | None = None) -> dict[str, Any]:
    status = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
    if failed is not None:
        status = {
            "jobDeploymentStatus": "Failed",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": failed,
        }
    refs = [{"uid": owner, "controller": True, "kind": "RLTrainingJob", "name": "job-a"}]
    return {"metadata": {"name": "job-a", "uid": uid, "ownerReferences": refs}, "status": status}


def job(status: dict[str, Any] | None = None, backoff: int = 1, name: str = "job-a") -> Job:
    return job_from_spec({"faultTolerance": {"backoffLimit": backoff}}, name=name, status=status)


def ready(phase: str, reason: str) -> dict[str, Any]:
    return {"phase": phase, "conditions": [{"type": "Ready", "status": "False", "reason": reason}]}


RESTARTED = {**ready("Starting", "Restarting"), "restartHistory": [{"attempt": 1, "rayJobUid": "rj-1"}]}

# (case, job, its RayJob as read, (apply, export, restart, replacing, leftover))
CASES = [
    ("a new job creates its children", job(), None, (True, True, False, False, None)),
    (
        "a running job keeps them applied",
        job(ready("Running", "Running")),
        rayjob(),
        (True, True, False, False, None),
    ),
    (
        "an earlier job's RayJob of the same name is waited for",
        job(),
        rayjob(owner="uid-earlier"),
        (False, False, False, False, "job-a"),
    ),
    (
        "a finished job only exports",
        job(ready("Succeeded", "Completed")),
        None,
        (False, True, False, False, None),
    ),
    (
        "the final export runs: nothing is created for training",
        job(ready("Converting", "Exporting")),
        None,
        (False, True, False, False, None),
    ),
    (
        "a killed driver is restarted",
        job(ready("Running", "Running")),
        rayjob(failed=KILLED),
        (False, True, True, False, None),
    ),
    (
        "past the backoff limit it is not",
        job(ready("Running", "Running"), backoff=0),
        rayjob(failed=KILLED),
        (True, True, False, False, None),
    ),
    (
        "a job the runtime refuses is not restarted",
        job(ready("Running", "Running")),
        rayjob(failed=REFUSED),
        (True, True, False, False, None),
    ),
    (
        # The restart goes on (recorded once, its delete repeated: idempotent); nothing is applied.
        "a recorded restart's RayJob is being deleted: nothing is applied to it",
        job(RESTARTED),
        rayjob(failed=KILLED),
        (False, True, True, True, None),
    ),
    ("its successor is created once it is gone", job(RESTARTED), None, (True, True, False, False, None)),
    ("a name KubeRay refuses creates nothing", job(name="x" * 60), None, (False, False, False, False, None)),
]


@pytest.mark.parametrize(("case", "the_job", "the_rayjob", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_plan_of_a_pass(
    case: str,
    the_job: Job,
    the_rayjob: dict[str, Any] | None,
    expected: tuple[bool, bool, bool, bool, str | None],
) -> None:
    got = plan(the_job, the_rayjob)
    assert (got.apply, got.export, got.restart is not None, got.replacing, got.leftover) == expected
    assert (got.blocker is not None) == the_job.name.startswith("xxx")
    assert got.rayjob is (None if got.leftover else the_rayjob)
