"""Names, labels and annotations the operator puts on what it creates."""

from __future__ import annotations

from rljob_api.resource import NAME_MAX

GROUP_PREFIX = "rljob.dev"
FINALIZER = f"{GROUP_PREFIX}/finalizer"

LABEL_JOB = f"{GROUP_PREFIX}/job"  # on every child and pod: the owning RLTrainingJob's name
LABEL_ROLE = f"{GROUP_PREFIX}/role"  # head / gpu / trainer / rollout on pods
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "rljob-operator"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass: Kueue's queue order
# Debugging aid: run this command instead of the runtime (the resolved job is still in RLJOB_JOB),
# e.g. to check an image or a cluster before a long run. Read when the RayJob is created.
ENTRYPOINT_ANNOTATION = f"{GROUP_PREFIX}/entrypoint"
# Environment assignments ("A=1 B=2") put before every entrypoint of the job (training and
# conversions): for a Ray that does not run in the pods, as the e2e harness's local Ray.
ENTRYPOINT_ENV_ANNOTATION = f"{GROUP_PREFIX}/entrypoint-env"

# Field manager that creates a Kueue job's RayJob suspended and then leaves `spec.suspend` to Kueue:
# the operator's own applies omit that field, so they never undo an admission (or a preemption).
KUEUE_GATE_MANAGER = "rljob-operator-kueue-gate"

# KubeRay names the RayCluster "<rayjob>-<5 chars>" and its services after that: RayJob names are
# limited to 47 characters. The CRD refuses longer job names at admission (rljob_api.resource).
RAYJOB_NAME_MAX = NAME_MAX


def rayjob_name(job: str) -> str:
    return job


def runtime_account_name(job: str) -> str:
    """ServiceAccount (and Role, RoleBinding) the runtime uses to report progress."""
    return f"{job}-runtime"


def child_labels(job: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "rljob",
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB: job,
    }
