"""Kueue: which jobs it admits, and what a job's RayJob says about its admission (pure).

What Kueue v0.17 does with a RayJob (sigs.k8s.io/kueue pkg/controller/jobframework):
- it manages a RayJob labelled `kueue.x-k8s.io/queue-name`; with `manageJobsWithoutQueueName` on,
  also every RayJob without that label in the namespaces its `managedJobsNamespaceSelector` picks;
- its webhook creates such a RayJob suspended (defaults.go ApplyDefaultForSuspend) and, when the
  label is missing and the namespace has a LocalQueue named `default`, adds the label with that
  name (ApplyDefaultLocalQueue; LocalQueueDefaulting is GA and always on in v0.17);
- it unsuspends the RayJob when its Workload is admitted and suspends it again on preemption;
- an RLTrainingJob is not a kind Kueue knows, so the RayJob is the top-level job it queues
  (reconciler.go FindAncestorJobManagedByKueue stops at an unknown owner);
- priority: the label `kueue.x-k8s.io/priority-class` names a WorkloadPriorityClass; without
  it the pods' PriorityClass (resources.priorityClassName) sets the Workload's priority.

So the operator leaves `spec.suspend` to Kueue for every job Kueue admits: it creates the RayJob
suspended under a field manager of its own (names.KUEUE_GATE_MANAGER) and never writes the field
again, and its own GPU-quota queue skips the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .job import Job
from .names import KUEUE_QUEUE_LABEL

# The LocalQueue Kueue's webhook puts a RayJob without a queue name in, when the namespace has one.
DEFAULT_LOCAL_QUEUE = "default"
WAITING_FOR_KUEUE = "WaitingForKueue"


def kueue_admits(job: Job, manage_jobs_without_queue_name: bool) -> bool:
    """Whether Kueue decides when the job's RayJob runs: the job names a LocalQueue, or the
    operator was told that Kueue manages jobs without one (Kueue's manageJobsWithoutQueueName)."""
    return bool(job.spec.queue_name) or manage_jobs_without_queue_name


def local_queue(job: Job, rayjob: Mapping[str, Any] | None) -> str | None:
    """The LocalQueue the RayJob waits in: spec.queueName, else the label Kueue's webhook put on the
    RayJob (the namespace's `default` LocalQueue), else None (Kueue has no queue for it)."""
    if job.spec.queue_name:
        return job.spec.queue_name
    labels = ((rayjob or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(KUEUE_QUEUE_LABEL) or None


def held_by_kueue(job: Job, rayjob: Mapping[str, Any]) -> bool:
    """Whether the job waits for Kueue: its RayJob is suspended although the job is not. The
    operator writes `spec.suspend: true` only for a suspended job or one its GPU quota holds (shown
    as Queued before this is asked), so anyone else holding the RayJob suspended is Kueue; so is a
    job with a queue name whose RayJob KubeRay has not resumed yet."""
    if job.spec.suspend:
        return False
    return bool((rayjob.get("spec") or {}).get("suspend")) or bool(job.spec.queue_name)


def waiting_message(queue: str | None) -> str:
    """Ready's message while Kueue has not admitted the RayJob."""
    if queue:
        return f"waiting for Kueue to admit the RayJob in LocalQueue {queue!r}"
    return (
        "waiting for Kueue, which keeps the RayJob suspended but has no LocalQueue for it: set "
        f"spec.queueName, or create a LocalQueue named {DEFAULT_LOCAL_QUEUE!r} in this namespace "
        "before the job"
    )
