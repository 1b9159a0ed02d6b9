"""Pre-flight checks (pure): problems that would make the RayJob fail or hang, found before any
object is created (what the pods report once they exist is read by pod_states). The reconciler
gathers the facts (nodes, secrets, claims) and passes them in."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rljob_api.paths import is_within
from rljob_api.resource import name_problem

from .build import worker_groups
from .job import Job
from .names import RAYJOB_NAME_MAX
from .quantity import whole_units


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
    """A name the CRD refuses today (jobs created before its name rules): KubeRay would refuse the
    RayJob, so nothing is created and the job fails with the rule's advice."""
    if len(job.name) > RAYJOB_NAME_MAX:
        return Blocker(
            "NameTooLong",
            f"the name {job.name!r} has {len(job.name)} characters; KubeRay allows at most {RAYJOB_NAME_MAX} "
            "for the RayJob it runs on. Create the job again with a shorter name.",
            terminal=True,
        )
    problem = name_problem(job.name)
    if problem:
        return Blocker("InvalidName", f"{job.name!r}: {problem}", terminal=True)
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


def claims_needed(job: Job) -> list[tuple[str, str]]:
    """(spec field, claim name) of every PersistentVolumeClaim the pods mount."""
    res = job.spec.resources
    needed: list[tuple[str, str]] = []
    if job.spec.checkpoint.volume is not None:
        needed.append(("checkpoint.volume.claimName", job.spec.checkpoint.volume.claim_name))
    if res.model_cache is not None:
        needed.append(("resources.modelCache.claimName", res.model_cache.claim_name))
    for i, volume in enumerate(res.volumes):
        if volume.persistent_volume_claim is not None:
            needed.append(
                (f"resources.volumes[{i}] ({volume.name})", volume.persistent_volume_claim.claim_name)
            )
    return needed


def secrets_needed(job: Job) -> list[tuple[str, str]]:
    """(spec field, Secret name) of every Secret the pods read and cannot start without."""
    res = job.spec.resources
    needed: list[tuple[str, str]] = []
    for field, ref in (
        ("resources.secrets.huggingFaceToken", res.secrets.hugging_face_token),
        ("resources.secrets.wandbApiKey", res.secrets.wandb_api_key),
    ):
        if ref is not None and not ref.optional:
            needed.append((field, ref.name))
    groups = [
        ("resources", res.env),
        ("resources.head", res.head.env),
        ("resources.trainer", res.trainer.env),
        ("resources.rollout", res.rollout.env),
    ]
    for prefix, envs in groups:
        for i, env in enumerate(envs):
            ref = env.value_from.secret_key_ref if env.value_from else None
            if ref is not None and not ref.optional:
                needed.append((f"{prefix}.env[{i}] ({env.name})", ref.name))
    for i, volume in enumerate(res.volumes):
        if volume.secret is not None and not volume.secret.optional:
            needed.append((f"resources.volumes[{i}] ({volume.name})", volume.secret.secret_name))
    return needed


def check_references(job: Job, secrets: set[str] | None, claims: set[str]) -> Blocker | None:
    """Secrets and PersistentVolumeClaims the pods would mount or read must exist. `secrets` is None
    when the operator may not read Secrets (the default install): then a missing one shows up as
    the pods' CreateContainerConfigError instead (pod_states)."""
    missing = [
        (field, name) for field, name in secrets_needed(job) if secrets is not None and name not in secrets
    ]
    if missing:
        listed = "; ".join(f"{name!r} (from spec.{field})" for field, name in missing)
        return Blocker(
            "SecretNotFound",
            f"Secret {listed} not found in namespace {job.namespace}. Create it; the job starts when it exists.",
        )
    missing = [(field, name) for field, name in claims_needed(job) if name not in claims]
    if missing:
        listed = "; ".join(f"{name!r} (spec.{field})" for field, name in missing)
        return Blocker(
            "VolumeNotFound",
            f"PersistentVolumeClaim {listed} not found in namespace {job.namespace}. Create it; the job "
            "starts when it exists.",
        )
    return None


# etcd refuses objects over 1.5 MiB; the RayJob also gains status and managedFields once stored.
RAYJOB_BYTES_MAX = 1_000_000


def check_children_fit(job: Job, rayjob: Mapping[str, Any]) -> Blocker | None:
    """The RayJob built from the spec must be storable: a limit on the whole, which no schema bound
    per field can express. (Pod annotations, also limited in total, are bounded per field so that
    the three maps a pod gets stay under pod validation's 256 KiB.)"""
    size = len(json.dumps(rayjob, separators=(",", ":")))
    if size > RAYJOB_BYTES_MAX:
        return Blocker(
            "SpecTooLarge",
            f"the RayJob built from this job would be {size} bytes, over the {RAYJOB_BYTES_MAX} the operator "
            "allows (etcd stores at most 1.5 MiB per object). Shorten resources.env, labels, annotations or "
            "rollout.sglangArgs, or move large values into a ConfigMap mounted with resources.volumes.",
            terminal=True,
        )
    return None


def check_host_paths(job: Job, allowed: tuple[str, ...]) -> Blocker | None:
    """hostPath volumes expose a node's files: only at or below the directories the operator's admin
    allows, compared by whole segments after normalisation ('/mnt/nvme-x' is not below '/mnt/nvme')."""
    refused = [
        (i, v.name, v.host_path.path)
        for i, v in enumerate(job.spec.resources.volumes)
        if v.host_path is not None and not any(is_within(v.host_path.path, p) for p in allowed)
    ]
    if not refused:
        return None
    listed = "; ".join(f"{path!r} (spec.resources.volumes[{i}], {name})" for i, name, path in refused)
    policy = f"only paths below {', '.join(allowed)}" if allowed else "no hostPath volumes"
    return Blocker(
        "HostPathNotAllowed",
        f"hostPath {listed} is not allowed: this operator's admin allows {policy} (rljob-operator "
        "--allow-host-path, chart value jobPods.allowedHostPaths). Use a PersistentVolumeClaim, or ask "
        "the admin to allow the path.",
    )


def _count(quantity: str) -> int:
    return whole_units(quantity)
