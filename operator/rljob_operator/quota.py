"""GPU accounting against ResourceQuota (pure).

ResourceQuota admits pods one at a time, so a gang can be half-created and then hang. The operator
therefore creates a job's RayJob only when the whole job fits:

    available = min over quotas (hard - used) - GPUs reserved by this operator's admitted jobs
                whose pods do not exist yet (so are not yet in `used`)

and admits waiting jobs strictly in creation order (FIFO): a job that does not fit blocks the
jobs behind it, so big jobs are not starved by a stream of small ones. A job larger than a quota's
hard limit can never fit: it is refused (QuotaTooSmall, Stalled) and holds up nobody.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rljob_api.status import TERMINAL_PHASES

from .job import Job
from .names import LABEL_COMPONENT, LABEL_JOB
from .quantity import whole_units


@dataclass(frozen=True)
class Quota:
    name: str
    hard: int
    used: int


@dataclass(frozen=True)
class JobDemand:
    """One of this operator's jobs in the namespace, as the quota sees it."""

    name: str
    created: datetime
    gpus: int
    admitted: bool  # its RayJob exists and is not suspended
    charged_gpus: int = 0  # GPUs of its pods that exist (already counted in quota `used`)

    @property
    def reserved(self) -> int:
        return max(0, self.gpus - self.charged_gpus) if self.admitted else 0


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str = ""
    message: str = ""
    position: int = 0  # 1-based place among waiting jobs
    impossible: bool = False  # larger than a quota's hard limit: waiting cannot help


def decide(name: str, jobs: Iterable[JobDemand], quotas: Iterable[Quota], resource: str) -> Decision:
    """May job `name` (one of `jobs`) be created now?"""
    jobs = list(jobs)
    quotas = list(quotas)
    me = next(j for j in jobs if j.name == name)
    if me.admitted or not quotas or me.gpus == 0:
        return Decision(True)
    tightest = min(quotas, key=lambda q: q.hard - q.used)
    smallest = min(quotas, key=lambda q: q.hard)
    if me.gpus > smallest.hard:
        return Decision(
            False,
            "QuotaTooSmall",
            f"needs {me.gpus} {resource} but ResourceQuota {smallest.name!r} allows at most {smallest.hard} "
            "in this namespace, so it can never start and does not hold up the jobs behind it. Ask an "
            "administrator to raise the quota, or create the job again with fewer GPUs.",
            impossible=True,
        )
    reserved = sum(j.reserved for j in jobs if j.name != name)
    available = tightest.hard - tightest.used - reserved
    fits_ever = [j for j in jobs if not j.admitted and 0 < j.gpus <= smallest.hard]
    waiting = sorted(fits_ever, key=lambda j: (j.created, j.name))
    for job in waiting:
        if job.gpus > available:
            break
        if job.name == name:
            return Decision(True)
        available -= job.gpus
    position = [j.name for j in waiting].index(name) + 1
    ahead = f"; {position - 1} job(s) ahead of it in the queue" if position > 1 else ""
    return Decision(
        False,
        "InsufficientQuota",
        f"needs {me.gpus} {resource}; ResourceQuota {tightest.name!r} allows {tightest.hard}, {tightest.used} in "
        f"use, {reserved} reserved by starting jobs{ahead}. It starts when enough GPUs are free.",
        position=position,
    )


def quotas_of(resource_quotas: Iterable[Mapping[str, Any]], resource: str) -> list[Quota]:
    """The namespace's ResourceQuotas that limit `requests.<resource>`, as the API server counts them."""
    key = f"requests.{resource}"
    return [
        Quota(
            q["metadata"]["name"],
            whole_units(q["status"]["hard"][key]),
            whole_units((q["status"].get("used") or {}).get(key, "0")),
        )
        for q in resource_quotas
        if key in ((q.get("status") or {}).get("hard") or {})
    ]


def charged_gpus(pods: Iterable[Mapping[str, Any]], resource: str) -> dict[str, int]:
    """{job name: the GPUs its live pods request}: what the quota's `used` already counts."""
    charged: dict[str, int] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owner = pod["metadata"]["labels"][LABEL_JOB]
        for container in pod["spec"]["containers"]:
            requests = (container.get("resources") or {}).get("requests") or {}
            charged[owner] = charged.get(owner, 0) + whole_units(requests.get(resource, "0"))
    return charged


def demands(
    me: Job,
    jobs: Iterable[Job],
    rayjobs: Iterable[Mapping[str, Any]],
    charged: Mapping[str, int],
    now: datetime,
) -> list[JobDemand]:
    """The namespace's jobs that compete for its quota (this operator's, not finished, suspended or
    left to Kueue), `me` included. Admitted: its training RayJob exists and is not suspended
    (conversion RayJobs take no GPUs)."""
    training = {
        r["metadata"]["labels"][LABEL_JOB]: r
        for r in rayjobs
        if LABEL_JOB in (r["metadata"].get("labels") or {})
        and r["metadata"]["labels"].get(LABEL_COMPONENT, "rayjob") == "rayjob"
    }
    out = []
    for job in jobs:
        if (
            job.deleting
            or job.spec.suspend
            or job.status.get("phase") in TERMINAL_PHASES
            or job.spec.queue_name
        ):
            continue
        rayjob = training.get(job.name)
        admitted = rayjob is not None and not (rayjob.get("spec") or {}).get("suspend")
        out.append(
            JobDemand(job.name, job.created or now, job.spec.total_gpus(), admitted, charged.get(job.name, 0))
        )
    if me.name not in {d.name for d in out}:
        out.append(JobDemand(me.name, me.created or now, me.spec.total_gpus(), False))
    return out
