"""Pre-flight checks (pure): problems that would make the RayJob fail or hang, found before any
object is created, and problems the job's pods report once they exist. The reconciler gathers the
facts (nodes, secrets, claims, pods) and passes them in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .build import worker_groups
from .job import Job
from .names import RAYJOB_NAME_MAX


@dataclass(frozen=True)
class Blocker:
    """Why the job cannot start. terminal: no change in the cluster can fix it (only a new job)."""

    reason: str
    message: str
    terminal: bool = False


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]


def check_name(job: Job) -> Blocker | None:
    if len(job.name) > RAYJOB_NAME_MAX:
        return Blocker(
            "NameTooLong",
            f"the name {job.name!r} has {len(job.name)} characters; KubeRay allows at most {RAYJOB_NAME_MAX} "
            "for the RayJob it runs on. Create the job again with a shorter name.",
            terminal=True,
        )
    return None


def check_nodes(job: Job, nodes: Iterable[NodeInfo]) -> Blocker | None:
    """Every worker group's per-pod GPUs must fit on some node its nodeSelector allows."""
    res = job.spec.resources
    if res.device != "cuda":
        return None
    nodes = list(nodes)
    gpu = res.gpu_resource_name
    for group in worker_groups(job):
        matching = [n for n in nodes if all(n.labels.get(k) == v for k, v in group.node_selector.items())]
        largest = max((_count(n.allocatable.get(gpu, "0")) for n in matching), default=0)
        if largest < group.gpus_per_pod:
            where = f"nodes matching {dict(group.node_selector)}" if group.node_selector else "nodes"
            found = (
                f"the largest of {len(matching)} such nodes offers {largest}"
                if matching
                else "there are none"
            )
            return Blocker(
                "NoNodeFits",
                f"worker group {group.name!r} needs {group.gpus_per_pod} {gpu} per pod on {where}, but {found}. "
                f"Lower resources.{'trainer' if group.name != 'rollout' else 'rollout'}.gpusPerNode, change the "
                "node selector, or add nodes.",
            )
    return None


def check_references(job: Job, secrets: set[str] | None, claims: set[str]) -> Blocker | None:
    """Secrets and PersistentVolumeClaims the pods would mount or read must exist. `secrets` is None
    when the operator may not read Secrets (the default install): then a missing one shows up as
    the pods' CreateContainerConfigError instead (check_pods)."""
    res = job.spec.resources
    needed: list[tuple[str, str]] = []
    for field, ref in (
        ("resources.secrets.huggingFaceToken", res.secrets.hugging_face_token),
        ("resources.secrets.wandbApiKey", res.secrets.wandb_api_key),
    ):
        if ref is not None and not ref.optional:
            needed.append((field, ref.name))
    for i, env in enumerate(res.env):
        ref = env.value_from.secret_key_ref if env.value_from else None
        if ref is not None and not ref.optional:
            needed.append((f"resources.env[{i}] ({env.name})", ref.name))
    missing = [(field, name) for field, name in needed if secrets is not None and name not in secrets]
    if missing:
        listed = "; ".join(f"{name!r} (from spec.{field})" for field, name in missing)
        return Blocker(
            "SecretNotFound",
            f"Secret {listed} not found in namespace {job.namespace}. Create it; the job starts when it exists.",
        )
    volume = job.spec.checkpoint.volume
    if volume is not None and volume.claim_name not in claims:
        return Blocker(
            "VolumeNotFound",
            f"PersistentVolumeClaim {volume.claim_name!r} (spec.checkpoint.volume.claimName) not found in "
            f"namespace {job.namespace}. Create it; the job starts when it exists.",
        )
    return None


# Waiting reasons no retry by the kubelet can fix without a change in the cluster or the spec.
_STUCK_WAITING = ("CreateContainerConfigError",)


def check_pods(job: Job, pods: Iterable[Mapping[str, Any]]) -> Blocker | None:
    """A job pod whose container cannot be created (a Secret or key it reads is missing, ...)."""
    for pod in pods:
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        ):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _STUCK_WAITING:
                detail = waiting.get("message") or waiting["reason"]
                return Blocker(
                    waiting["reason"],
                    f"pod {pod['metadata']['name']} cannot start container {container.get('name')!r}: "
                    f"{detail}. Create what it names in namespace {job.namespace}; the pod starts when it exists.",
                )
    return None


def _count(quantity: str) -> int:
    try:
        return int(quantity)
    except ValueError:
        return 0
