"""Pure builders for the runtime's identity: a ServiceAccount allowed to report progress of its
own job only (get + patch on rltrainingjobs/status, resourceNames = the job) and to create events
in its namespace (an event's name is generated, so it cannot be limited by resourceNames), nothing
else."""

from __future__ import annotations

from typing import Any

from rljob_api.resource import GROUP, PLURAL

from .job import Job
from .names import child_labels, runtime_account_name


def _meta(job: Job) -> dict[str, Any]:
    return {
        "name": runtime_account_name(job.name),
        "namespace": job.namespace,
        "labels": child_labels(job.name, "runtime-identity"),
        "ownerReferences": [job.owner_reference()],
    }


def build_runtime_rbac(job: Job) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, in the order they must exist."""
    if job.spec.resources.service_account_name:
        return []  # the user brings their own identity and its permissions
    name = runtime_account_name(job.name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(job),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(job),
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": [f"{PLURAL}/status"],
                    "resourceNames": [job.name],
                    "verbs": ["get", "patch"],
                },
                {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [job.name], "verbs": ["get"]},
                # Announcing what happens inside the run (a trainer restart) on the job's events.
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(job),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
        },
    ]
