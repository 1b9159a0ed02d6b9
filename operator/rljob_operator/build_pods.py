"""Pure builder of the pod templates of a job's RayCluster: containers, volumes, security, metadata.

Every pod (head, trainer, rollout) sees the same files at the same paths: the checkpoint volume,
the model cache, the hub token, and the user's volumes; so model.path, data.path and hooks resolve
the same wherever the runtime reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rljob_api.pod_paths import (
    CHECKPOINT_VOLUME,
    HF_HOME,
    HF_TOKEN_DIR,
    HF_TOKEN_PATH,
    HF_TOKEN_VOLUME,
    HOME_PATH,
    HOME_VOLUME,
    MODEL_CACHE_PATH,
    MODEL_CACHE_VOLUME,
    RLJOB_CACHE,
    SHM_PATH,
    SHM_VOLUME,
    TMP_PATH,
    TMP_VOLUME,
)
from rljob_api.spec_resources import EnvVar, PodResources, Toleration
from rljob_api.spec_volumes import Volume

from .job import Job
from .names import LABEL_JOB, LABEL_ROLE, runtime_account_name

HEAD_PORTS = [
    {"name": "gcs", "containerPort": 6379},
    {"name": "dashboard", "containerPort": 8265},
    {"name": "client", "containerPort": 10001},
    {"name": "metrics", "containerPort": 8080},
]


@dataclass(frozen=True)
class PodGroup:
    """One kind of pod of the job: its role, size and what the user added to it."""

    role: str  # head / gpu / trainer / rollout
    gpus: int  # GPUs each pod requests (0 for the head and for device cpu)
    cpu: str | None
    memory: str | None
    node_selector: dict[str, str]
    tolerations: list[Toleration]
    extras: tuple[PodResources, ...] = field(default=())  # the spec sections whose labels/env apply, in order


def pod_template(job: Job, group: PodGroup, *, capabilities: tuple[str, ...] = ()) -> dict[str, Any]:
    """The pod template of `group`. `capabilities` (an operator setting, e.g. IPC_LOCK for RDMA) are
    added to GPU containers only; without them every pod passes the `restricted` Pod Security Standard."""
    res = job.spec.resources
    volumes, mounts = _volumes(job, shm=group.gpus > 0)
    container: dict[str, Any] = {
        "name": "ray-head" if group.role == "head" else "ray-worker",
        "image": res.image,
        "imagePullPolicy": res.image_pull_policy,
        "env": _env(job, group),
        "resources": _resources(group.cpu, group.memory, group.gpus, res.gpu_resource_name),
        "volumeMounts": mounts,
        "securityContext": _container_security(
            capabilities if group.gpus else (), read_only=res.security_context.read_only_root_filesystem
        ),
    }
    grace = job.spec.fault_tolerance.termination_grace_period_seconds
    if group.role == "head":
        container["ports"] = HEAD_PORTS
        # KubeRay deletes a suspended job's Ray cluster without stopping its Ray job, whose driver
        # runs in a session of its own: the hook gives the runtime the SIGTERM it checkpoints on
        # (rljob_runtime/stop.py) and holds the pod until it has exited.
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["rljob-runtime", "stop", "--timeout", str(grace)]}}
        }
    security = res.security_context
    pod_security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": security.run_as_user,
        "runAsGroup": security.run_as_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if security.fs_group is not None:
        pod_security["fsGroup"] = security.fs_group
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "serviceAccountName": res.service_account_name or runtime_account_name(job.name),
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    }
    if group.node_selector:
        pod_spec["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in group.tolerations]
    affinity = res.affinity.model_dump(by_alias=True, exclude_none=True) if res.affinity else {}
    if affinity:
        pod_spec["affinity"] = affinity
    if res.priority_class_name:
        pod_spec["priorityClassName"] = res.priority_class_name
    if res.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in res.image_pull_secrets]
    labels = {**res.labels}
    annotations = {**res.annotations}
    for extra in group.extras:
        labels.update(extra.labels)
        annotations.update(extra.annotations)
    labels.update({LABEL_JOB: job.name, LABEL_ROLE: group.role})  # last: the operator selects by them
    metadata: dict[str, Any] = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def _container_security(capabilities: tuple[str, ...], *, read_only: bool) -> dict[str, Any]:
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if capabilities:
        caps["add"] = list(capabilities)
    security: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": caps}
    if read_only:
        security["readOnlyRootFilesystem"] = True
    return security


def _resources(cpu: str | None, memory: str | None, gpus: int, gpu_name: str) -> dict[str, Any]:
    amounts: dict[str, str] = {}
    if cpu:
        amounts["cpu"] = cpu
    if memory:
        amounts["memory"] = memory
    if gpus:
        amounts[gpu_name] = str(gpus)
    # Requests equal limits: training pods should not be overcommitted (Guaranteed QoS when both set).
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _volumes(job: Job, *, shm: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the container's mounts): the operator's own, then the user's."""
    spec = job.spec
    res = spec.resources
    checkpoint = spec.checkpoint.volume
    volumes: list[dict[str, Any]] = [
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": checkpoint.claim_name}}
        if checkpoint is not None
        else {"name": CHECKPOINT_VOLUME, "emptyDir": {}}
    ]
    mounts: list[dict[str, Any]] = [
        _mount(CHECKPOINT_VOLUME, spec.checkpoint.path, checkpoint.sub_path if checkpoint else None)
    ]
    cache = res.model_cache
    volumes.append(
        {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}}
        if cache is not None
        else {"name": MODEL_CACHE_VOLUME, "emptyDir": {}}
    )
    mounts.append(_mount(MODEL_CACHE_VOLUME, MODEL_CACHE_PATH, cache.sub_path if cache else None))
    token = res.secrets.hugging_face_token
    if token is not None:
        # A file readable by the pods' user only; huggingface_hub reads it through HF_TOKEN_PATH.
        volumes.append(
            {
                "name": HF_TOKEN_VOLUME,
                "secret": {
                    "secretName": token.name,
                    "items": [{"key": token.key, "path": HF_TOKEN_PATH.rsplit("/", 1)[1]}],
                    "defaultMode": 0o400,
                    "optional": token.optional,
                },
            }
        )
        mounts.append({"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True})
    if shm:
        # NCCL and CUDA IPC need far more shared memory than the container default of 64 MiB.
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    for volume in res.volumes:
        volumes.append({"name": volume.name, **_source(volume)})
        mount = _mount(volume.name, volume.mount_path, volume.sub_path)
        if volume.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    if res.security_context.read_only_root_filesystem:
        # The writable scratch of a read-only container, unless a volume of the job already sits there.
        # First in the list: volumes below /tmp (the demo's checkpoints) are mounted on top of it.
        taken = {m["mountPath"].rstrip("/") for m in mounts}
        scratch = [(n, p) for n, p in ((TMP_VOLUME, TMP_PATH), (HOME_VOLUME, HOME_PATH)) if p not in taken]
        volumes[:0] = [{"name": name, "emptyDir": {}} for name, _ in scratch]
        mounts[:0] = [{"name": name, "mountPath": path} for name, path in scratch]
    return volumes, mounts


def _mount(name: str, path: str, sub_path: str | None) -> dict[str, Any]:
    mount = {"name": name, "mountPath": path}
    if sub_path:
        mount["subPath"] = sub_path
    return mount


def _source(volume: Volume) -> dict[str, Any]:
    source, body = volume.source()
    doc = body.model_dump(by_alias=True, exclude_none=True)
    if source in ("configMap", "secret") and not doc.get("items"):
        doc.pop("items", None)
    if source == "secret":
        doc["defaultMode"] = 0o400  # readable by the pods' user only
    if source == "persistentVolumeClaim" and volume.read_only:
        doc["readOnly"] = True
    return {source: doc}


def _env(job: Job, group: PodGroup) -> list[dict[str, Any]]:
    res = job.spec.resources
    env: list[dict[str, Any]] = [
        *([{"name": "HOME", "value": HOME_PATH}] if res.security_context.read_only_root_filesystem else []),
        {"name": "RLJOB_JOB_NAME", "value": job.name},
        {"name": "RLJOB_NAMESPACE", "value": job.namespace},
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "RLJOB_CACHE", "value": RLJOB_CACHE},
    ]
    if res.device == "cpu":
        # Ray starts its workers at nice 15; on a CPU job they are the compute. Niced, a trainer rank's
        # threads lose their cores to every other process of the node (kubelet, Ray's own) and wait
        # for each other at every parallel region: the CPU demo's first train phase, in real pods,
        # took 37 s at nice 15 and 27 s at nice 0.
        env.append({"name": "RAY_worker_niceness", "value": "0"})
    if res.secrets.hugging_face_token is not None:
        env.append({"name": "HF_TOKEN_PATH", "value": HF_TOKEN_PATH})
    wandb = res.secrets.wandb_api_key
    if wandb is not None:
        env.append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": wandb.model_dump(by_alias=True)}})
    # A group's variable replaces the job-wide one of the same name (one entry per name).
    user: dict[str, dict[str, Any]] = {}
    for var in [*res.env, *(e for extra in group.extras for e in extra.env)]:
        user[var.name] = _env_var(var)
    return [e for e in env if e["name"] not in user] + list(user.values())


def _env_var(var: EnvVar) -> dict[str, Any]:
    return var.model_dump(by_alias=True, exclude_none=True)
