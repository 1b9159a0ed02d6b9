"""Pure builder of a job's NetworkPolicy: its pods accept connections only from each other (Ray's
GCS, object transfers, NCCL, the router) and from the KubeRay operator (job submission and status
through the dashboard). NetworkPolicies add up: an admin allows more (a Prometheus scraping Ray's
metrics port) with a policy of their own selecting the label rljob.dev/job."""

from __future__ import annotations

from typing import Any

from .job import Job
from .names import LABEL_JOB, child_labels

KUBERAY_POD_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}


def network_policy_name(job: str) -> str:
    return f"{job}-ray"


def build_network_policy(job: Job, *, kuberay_namespace: str | None = None) -> dict[str, Any]:
    """`kuberay_namespace`: where the KubeRay operator runs; None allows its pods in any namespace."""
    kuberay: dict[str, Any] = {"podSelector": {"matchLabels": dict(KUBERAY_POD_LABELS)}}
    kuberay["namespaceSelector"] = (
        {"matchLabels": {"kubernetes.io/metadata.name": kuberay_namespace}} if kuberay_namespace else {}
    )
    own = {"podSelector": {"matchLabels": {LABEL_JOB: job.name}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(job.name),
            "namespace": job.namespace,
            "labels": child_labels(job.name, "network-policy"),
            "ownerReferences": [job.owner_reference()],
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: job.name}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [own, kuberay]}],
        },
    }
