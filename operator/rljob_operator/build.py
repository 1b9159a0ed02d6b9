"""Pure builders: an RLTrainingJob -> the KubeRay RayJob (inline RayCluster) that runs it.

No I/O here: the handlers apply what these functions return with server-side apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import yaml

from rljob_api.contract import (
    ENTRYPOINT,
    JOB_ENV,
    RAY_RESOURCE_COLOCATED,
    RAY_RESOURCE_ROLLOUT,
    RAY_RESOURCE_TRAINER,
    resolved_job_json,
)
from rljob_api.spec_resources import EnvVar, Toleration, rollout_gpus, rollout_pods

from .job import Job
from .names import (
    ENTRYPOINT_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    LABEL_JOB,
    LABEL_ROLE,
    child_labels,
    rayjob_name,
    runtime_account_name,
)

HEAD_PORTS = [
    {"name": "gcs", "containerPort": 6379},
    {"name": "dashboard", "containerPort": 8265},
    {"name": "client", "containerPort": 10001},
    {"name": "metrics", "containerPort": 8080},
]


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide choices (flags of rljob-operator), not part of any one job."""

    ray_version: str = "2.60.0"
    submission_mode: Literal["HTTPMode", "K8sJobMode"] = "HTTPMode"
    # Check that referenced Secrets exist before creating anything. Needs `get secrets` in the
    # job's namespace, which the chart grants only per namespace on request; without it a missing
    # Secret shows as the pods' CreateContainerConfigError.
    secret_preflight: bool = False


@dataclass(frozen=True)
class WorkerGroup:
    name: str
    pods: int
    gpus_per_pod: int  # GPUs (or CPU slots with device cpu) each pod holds
    ray_resource: str
    cpu: str | None
    memory: str | None
    node_selector: dict[str, str]
    tolerations: list[Toleration]


def worker_groups(job: Job) -> list[WorkerGroup]:
    """colocated: one `gpu` group; disaggregated: `trainer` and `rollout` groups."""
    res = job.spec.resources
    trainer = res.trainer
    if res.colocate:
        return [
            WorkerGroup(
                "gpu",
                trainer.nodes,
                trainer.gpus_per_node,
                RAY_RESOURCE_COLOCATED,
                trainer.cpu,
                trainer.memory,
                {**res.node_selector, **trainer.node_selector, **res.rollout.node_selector},
                [*res.tolerations, *trainer.tolerations, *res.rollout.tolerations],
            )
        ]
    rollout = res.rollout
    pods = rollout_pods(res)
    return [
        WorkerGroup(
            "trainer",
            trainer.nodes,
            trainer.gpus_per_node,
            RAY_RESOURCE_TRAINER,
            trainer.cpu,
            trainer.memory,
            {**res.node_selector, **trainer.node_selector},
            [*res.tolerations, *trainer.tolerations],
        ),
        WorkerGroup(
            "rollout",
            pods,
            rollout_gpus(res) // pods,
            RAY_RESOURCE_ROLLOUT,
            rollout.cpu,
            rollout.memory,
            {**res.node_selector, **rollout.node_selector},
            [*res.tolerations, *rollout.tolerations],
        ),
    ]


def build_rayjob(job: Job, settings: BuildSettings, *, suspend: bool | None) -> dict[str, Any]:
    """The RayJob for `job`. `suspend` is decided by the caller (spec.suspend, quota, Kueue);
    None leaves the field out, so whoever owns it (Kueue) keeps it."""
    spec = job.spec
    labels = child_labels(job.name, "rayjob")
    if spec.queue_name:
        labels[KUEUE_QUEUE_LABEL] = spec.queue_name
    rayjob_spec: dict[str, Any] = {
        "entrypoint": job.annotations.get(ENTRYPOINT_ANNOTATION, ENTRYPOINT),
        "runtimeEnvYAML": yaml.safe_dump(
            {
                "env_vars": {
                    JOB_ENV: resolved_job_json(
                        spec, name=job.name, namespace=job.namespace, uid=job.uid, generation=job.generation
                    )
                }
            },
            width=1 << 20,
        ),
        "submissionMode": settings.submission_mode,
        "shutdownAfterJobFinishes": True,
        "backoffLimit": spec.fault_tolerance.backoff_limit,
        "suspend": suspend,
        "rayClusterSpec": {
            "rayVersion": settings.ray_version,
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
                "template": _pod_template(
                    job, "head", gpus=0, cpu=spec.resources.head.cpu, memory=spec.resources.head.memory
                ),
            },
            "workerGroupSpecs": [_worker_group_spec(job, group) for group in worker_groups(job)],
        },
    }
    if suspend is None:
        del rayjob_spec["suspend"]
    if spec.ttl_seconds_after_finished is not None:
        rayjob_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": rayjob_name(job.name),
            "namespace": job.namespace,
            "labels": labels,
            "ownerReferences": [job.owner_reference()],
        },
        "spec": rayjob_spec,
    }


def _worker_group_spec(job: Job, group: WorkerGroup) -> dict[str, Any]:
    gpus = group.gpus_per_pod if job.spec.resources.device == "cuda" else 0
    return {
        "groupName": group.name,
        "replicas": group.pods,
        "minReplicas": group.pods,
        "maxReplicas": group.pods,
        # The custom resource lets the runtime's placement groups target exactly these pods.
        "resources": {group.ray_resource: str(group.gpus_per_pod)},
        "rayStartParams": {},
        "template": _pod_template(
            job,
            group.name,
            gpus=gpus,
            cpu=group.cpu,
            memory=group.memory,
            node_selector=group.node_selector,
            tolerations=group.tolerations,
        ),
    }


def _pod_template(
    job: Job,
    role: str,
    *,
    gpus: int,
    cpu: str | None,
    memory: str | None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[Toleration] | None = None,
) -> dict[str, Any]:
    res = job.spec.resources
    container: dict[str, Any] = {
        "name": "ray-head" if role == "head" else "ray-worker",
        "image": res.image,
        "imagePullPolicy": res.image_pull_policy,
        "env": _env(job),
        "resources": _resources(cpu, memory, gpus, res.gpu_resource_name),
        "volumeMounts": [_checkpoint_mount(job)],
    }
    if role == "head":
        container["ports"] = HEAD_PORTS
    volumes: list[dict[str, Any]] = [_checkpoint_volume(job)]
    if gpus:
        # NCCL and CUDA IPC need far more shared memory than the container default of 64 MiB.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}})
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    pod_spec: dict[str, Any] = {
        "serviceAccountName": res.service_account_name or runtime_account_name(job.name),
        "containers": [container],
        "volumes": volumes,
    }
    selector = res.node_selector if node_selector is None else node_selector
    if selector:
        pod_spec["nodeSelector"] = dict(selector)
    tols = res.tolerations if tolerations is None else tolerations
    if tols:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in tols]
    if res.affinity:
        pod_spec["affinity"] = res.affinity
    if res.priority_class_name:
        pod_spec["priorityClassName"] = res.priority_class_name
    if res.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in res.image_pull_secrets]
    return {"metadata": {"labels": {LABEL_JOB: job.name, LABEL_ROLE: role}}, "spec": pod_spec}


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


def _checkpoint_mount(job: Job) -> dict[str, Any]:
    mount = {"name": "checkpoints", "mountPath": job.spec.checkpoint.path}
    volume = job.spec.checkpoint.volume
    if volume is not None and volume.sub_path:
        mount["subPath"] = volume.sub_path
    return mount


def _checkpoint_volume(job: Job) -> dict[str, Any]:
    volume = job.spec.checkpoint.volume
    if volume is None:
        return {"name": "checkpoints", "emptyDir": {}}
    return {"name": "checkpoints", "persistentVolumeClaim": {"claimName": volume.claim_name}}


def _env(job: Job) -> list[dict[str, Any]]:
    res = job.spec.resources
    env: list[dict[str, Any]] = [
        {"name": "RLJOB_JOB_NAME", "value": job.name},
        {"name": "RLJOB_NAMESPACE", "value": job.namespace},
    ]
    secrets = res.secrets
    for var, ref in (("HF_TOKEN", secrets.hugging_face_token), ("WANDB_API_KEY", secrets.wandb_api_key)):
        if ref is not None:
            env.append({"name": var, "valueFrom": {"secretKeyRef": ref.model_dump(by_alias=True)}})
    env += [_env_var(e) for e in res.env]
    return env


def _env_var(var: EnvVar) -> dict[str, Any]:
    return var.model_dump(by_alias=True, exclude_none=True)
