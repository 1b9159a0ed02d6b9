"""Pure builders: an RLTrainingJob -> the KubeRay RayJob (inline RayCluster) that runs it.

No I/O here: the handlers apply what these functions return with server-side apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import yaml

from rljob_api.contract import (
    ENTRYPOINT,
    JOB_ENV,
    MEGATRON_CACHE_ENV,
    RAY_RESOURCE_COLOCATED,
    RAY_RESOURCE_ROLLOUT,
    RAY_RESOURCE_TRAINER,
    resolved_job_json,
)
from rljob_api.spec_resources import PodResources, Toleration, rollout_gpus, rollout_pods

from .build_network import build_network_policy
from .build_pods import PodGroup, pod_template
from .build_rbac import build_runtime_rbac
from .conversions import Wanted, needs_megatron_checkpoint
from .job import Job
from .names import (
    ENTRYPOINT_ANNOTATION,
    ENTRYPOINT_ENV_ANNOTATION,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    child_labels,
    rayjob_name,
)

_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # the same YAML, made in C when libyaml is there


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide choices (flags of rljob-operator), not part of any one job."""

    ray_version: str = "2.60.0"
    submission_mode: Literal["HTTPMode", "K8sJobMode"] = "HTTPMode"
    # Check that referenced Secrets exist before creating anything. Needs `get secrets` in the
    # job's namespace, which the chart grants only per namespace on request; without it a missing
    # Secret shows as the pods' CreateContainerConfigError.
    secret_preflight: bool = False
    # Capabilities added to GPU containers (e.g. IPC_LOCK for RDMA). Empty: every pod passes the
    # `restricted` Pod Security Standard; set by the operator's admin, never by a job.
    gpu_capabilities: tuple[str, ...] = ()
    # Node directories jobs may mount as hostPath volumes (prefixes); empty: none.
    allowed_host_paths: tuple[str, ...] = ()
    # Protect the Ray dashboard and job API with a token (KubeRay authOptions; Ray >= 2.52).
    ray_auth: bool = True
    # A NetworkPolicy per job: its pods accept traffic only from each other and from KubeRay.
    network_policy: bool = True
    kuberay_namespace: str | None = None  # where KubeRay runs (the policy's peer); None: any namespace
    # Kueue runs with manageJobsWithoutQueueName: it admits every job, also those without
    # spec.queueName, so the operator leaves spec.suspend of every RayJob to it (kueue.py).
    kueue_manage_jobs_without_queue_name: bool = False


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
    extras: tuple[PodResources, ...]  # spec sections whose labels, annotations and env the pods get


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
                (trainer, res.rollout),
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
            (trainer,),
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
            (rollout,),
        ),
    ]


def build_prerequisites(job: Job, settings: BuildSettings) -> list[dict[str, Any]]:
    """What must exist before the RayJob, in order: the runtime's identity, the NetworkPolicy."""
    children = build_runtime_rbac(job)
    if settings.network_policy:
        children.append(build_network_policy(job, kuberay_namespace=settings.kuberay_namespace))
    return children


def prerequisite_waves(children: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The prerequisites in the order the API server needs them: RoleBindings after the rest. An
    identity without the `bind` verb (the operator's own) may bind a Role only when it holds every
    rule of it, and the API server reads the Role to check that: a RoleBinding sent beside its Role
    is refused (404, the Role not found) until the Role exists."""
    bindings = [c for c in children if c["kind"] == "RoleBinding"]
    rest = [c for c in children if c["kind"] != "RoleBinding"]
    return [wave for wave in (rest, bindings) if wave]


RAY_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"


def build_rayjob(job: Job, settings: BuildSettings, *, suspend: bool | None) -> dict[str, Any]:
    """The RayJob for `job`. `suspend` is decided by the caller (spec.suspend, quota, Kueue): True
    sets it; False and None leave the field out (False: nobody else owns it, so it is removed; None:
    whoever owns it, Kueue, keeps it)."""
    spec = job.spec
    labels = child_labels(job.name, "rayjob")
    if spec.queue_name:
        labels[KUEUE_QUEUE_LABEL] = spec.queue_name
    if spec.workload_priority_class_name:
        labels[KUEUE_PRIORITY_LABEL] = spec.workload_priority_class_name
    env = {
        JOB_ENV: resolved_job_json(
            spec, name=job.name, namespace=job.namespace, uid=job.uid, generation=job.generation
        )
    }
    if needs_megatron_checkpoint(job):  # the conversion job put it in the model cache
        env[MEGATRON_CACHE_ENV] = "1"
    # Ray's job supervisor reads it from the job's runtime environment: a stopped Ray job (a deleted
    # RayJob) gets the grace period between its SIGTERM and SIGKILL, not Ray's 3 s.
    env[RAY_STOP_WAIT_ENV] = str(spec.fault_tolerance.termination_grace_period_seconds)
    rayjob = _rayjob(
        job,
        settings,
        name=rayjob_name(job.name),
        labels=labels,
        entrypoint=job.annotations.get(ENTRYPOINT_ANNOTATION, ENTRYPOINT),
        env=env,
        workers=[_worker_group_spec(job, group, settings) for group in worker_groups(job)],
    )
    rayjob_spec = rayjob["spec"]
    # Zero values are left out: KubeRay's Go types drop them (`omitempty`) when it writes the RayJob (it
    # adds its finalizer at creation), which moved the RayJob's generation and cost a second apply of
    # every new RayJob to put `suspend: false` back. Left out, the operator owns no such field, and a
    # `suspend: true` it applied before (a queued job) goes when it stops applying it: admitted.
    if suspend:
        rayjob_spec["suspend"] = True
    if spec.ttl_seconds_after_finished:
        rayjob_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    deadline = active_deadline_seconds(job)
    if deadline is not None:
        rayjob_spec["activeDeadlineSeconds"] = deadline
    return rayjob


def build_conversion_rayjob(job: Job, settings: BuildSettings, wanted: Wanted) -> dict[str, Any]:
    """The RayJob of one conversion: a Ray cluster of one pod built like the head (the job's image,
    volumes, model cache, token, security context; resources.head's CPU and memory), whose
    entrypoint is the conversion command. No GPUs, so no quota or Kueue admission: it starts at once,
    unless Kueue manages jobs without a queue name: then Kueue suspends it at creation and admits it,
    through the job's LocalQueue when it names one."""
    labels = child_labels(job.name, "conversion")
    if settings.kueue_manage_jobs_without_queue_name and job.spec.queue_name:
        labels[KUEUE_QUEUE_LABEL] = job.spec.queue_name
    return _rayjob(
        job, settings, name=wanted.name, labels=labels, entrypoint=wanted.command, env={}, workers=[]
    )


def _rayjob(
    job: Job,
    settings: BuildSettings,
    *,
    name: str,
    labels: dict[str, str],
    entrypoint: str,
    env: dict[str, str],
    workers: list[dict[str, Any]],
) -> dict[str, Any]:
    prefix = job.annotations.get(ENTRYPOINT_ENV_ANNOTATION, "").strip()
    rayjob_spec: dict[str, Any] = {
        "entrypoint": f"{prefix} {entrypoint}" if prefix else entrypoint,
        # libyaml's emitter (CSafeDumper): the pure-Python one took an eighth of the operator's CPU
        "runtimeEnvYAML": yaml.dump({"env_vars": env}, Dumper=_YAML_DUMPER, width=1 << 20),
        "submissionMode": settings.submission_mode,
        "shutdownAfterJobFinishes": True,
        # The operator restarts the whole job itself (restarts.py): KubeRay would retry every
        # failure, a refused config too, and keep no reason per attempt.
        "backoffLimit": 0,
        "rayClusterSpec": {
            "rayVersion": settings.ray_version,
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
                "template": pod_template(job, _head_group(job)),
            },
            "workerGroupSpecs": workers,
        },
    }
    if not env:
        del rayjob_spec["runtimeEnvYAML"]
    if settings.ray_auth:
        # KubeRay makes a Secret with a random token, gives it to every Ray pod and uses it itself.
        rayjob_spec["rayClusterSpec"]["authOptions"] = {"mode": "token"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": labels,
            "ownerReferences": [job.owner_reference()],
        },
        "spec": rayjob_spec,
    }


def active_deadline_seconds(job: Job) -> int | None:
    """spec.activeDeadlineSeconds bounds the whole job; KubeRay counts it from the RayJob's start, so
    a restarted job's RayJob gets what was left when the last restart began (at least 1 s)."""
    deadline = job.spec.active_deadline_seconds
    entries = job.status.get("restartHistory") or []
    started = job.status.get("startTime")
    if deadline is None or not entries or not started:
        return deadline
    spent = _parse_time(entries[-1]["time"]) - _parse_time(started)
    return max(1, deadline - int(spent.total_seconds()))


def _parse_time(stamp: Any) -> datetime:
    if isinstance(stamp, datetime):
        return stamp
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def _head_group(job: Job) -> PodGroup:
    res = job.spec.resources
    head = res.head
    return PodGroup(
        "head",
        0,
        head.cpu,
        head.memory,
        dict(res.node_selector),
        [*res.tolerations, *head.tolerations],
        (head,),
    )


def _worker_group_spec(job: Job, group: WorkerGroup, settings: BuildSettings) -> dict[str, Any]:
    gpus = group.gpus_per_pod if job.spec.resources.device == "cuda" else 0
    pods = PodGroup(
        group.name, gpus, group.cpu, group.memory, group.node_selector, group.tolerations, group.extras
    )
    return {
        "groupName": group.name,
        "replicas": group.pods,
        "minReplicas": group.pods,
        "maxReplicas": group.pods,
        # The custom resource lets the runtime's placement groups target exactly these pods.
        "resources": {group.ray_resource: str(group.gpus_per_pod)},
        "rayStartParams": {},
        # As KubeRay writes it (a Go struct: never left out): without it, KubeRay's first write of the
        # RayJob (its finalizer) added it, which moved the RayJob's generation, and the operator's apply
        # that followed took it out again: two more writes and a pass per new job.
        "scaleStrategy": {},
        "template": pod_template(job, pods, capabilities=settings.gpu_capabilities),
    }
