"""Why a starting job is stuck, read from its pods and its RayJob (pure).

The kubelet, the scheduler and KubeRay each say why a pod does not run, in a different place:
a container's waiting reason (ImagePullBackOff, CreateContainerConfigError, CrashLoopBackOff), the
pod's PodScheduled=False/Unschedulable condition, and, when the API server refuses to create a pod
(a ResourceQuota), KubeRay's RayCluster condition ReplicaFailure (KubeRay v1.6 copies the
RayCluster's status, conditions included, into the RayJob's `status.rayClusterStatus`; it also
posts a FailedToCreateWorkerPod event on the RayCluster, which the operator need not read). This
module turns them into one reason and a message that tells a person what to do.

A running job's pods can lose their node instead: its kubelet stops reporting (the node's Ready
condition turns Unknown) or reports it not ready. The containers may run on, but nothing manages
them; `node_trouble` says which pod and node, so the job shows why before Kubernetes evicts them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .names import LABEL_ROLE
from .pod_fields import fields_named


@dataclass(frozen=True)
class Stuck:
    """Why the job's Ray cluster does not start. `since`: when it got stuck (the startup deadline
    counts from there). `stalls_at_once`: only a person's change can clear it (a missing Secret, an
    invalid image name), so waiting for the deadline would tell nobody anything new."""

    reason: str
    message: str
    since: datetime | None = None
    stalls_at_once: bool = False

    def overdue(self, now: datetime, timeout_seconds: int) -> bool:
        """Whether it has been stuck for the whole startup timeout."""
        return self.since is not None and now - self.since >= timedelta(seconds=timeout_seconds)


# Every reason classify() can return, most actionable first: when several pods are stuck the
# first of these is reported (with a count of the other pods).
REASONS = (
    "CreateContainerConfigError",
    "InvalidImageName",
    "ErrImageNeverPull",
    "PodCreationRefused",
    "QuotaExceeded",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
    "Unschedulable",
)
_AT_ONCE = {"CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull", "PodCreationRefused"}
_IMAGE = {"InvalidImageName", "ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull"}
_QUOTA = re.compile(r"exceeded quota: (?P<quota>[^,\s]+)")


def classify(
    pods: Iterable[Mapping[str, Any]],
    rayjob: Mapping[str, Any] | None,
    namespace: str,
    volume_fields: Mapping[str, str] | None = None,
) -> Stuck | None:
    """The job's most actionable problem, or None when nothing is stuck (yet). `volume_fields`: the
    job field behind each pod volume (pod_fields.volume_fields), named when a refusal names one."""
    found: list[tuple[str, Stuck]] = []  # (pod name, problem)
    refused = _creation_refused(rayjob, volume_fields or {})
    if refused is not None:
        found.append(("", refused))
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # on its way out: its replacement is what matters
        found += [(pod["metadata"]["name"], stuck) for stuck in _pod_problems(pod, namespace)]
    if not found:
        return None
    found.sort(key=lambda f: (REASONS.index(f[1].reason), f[0]))
    name, first = found[0]
    others = len({n for n, s in found if s.reason == first.reason and n and n != name})
    if others:
        plural = "s" if others > 1 else ""
        first = Stuck(
            first.reason,
            f"{first.message} ({others} other pod{plural} of the job: the same)",
            first.since,
            first.stalls_at_once,
        )
    return first


def _creation_refused(rayjob: Mapping[str, Any] | None, volume_fields: Mapping[str, str]) -> Stuck | None:
    """KubeRay could not create a pod: the API server refused it (a ResourceQuota, PodSecurity, a
    LimitRange, a webhook). KubeRay's message is '<reason>\\n<the API server's message>'."""
    cluster = ((rayjob or {}).get("status") or {}).get("rayClusterStatus") or {}
    for condition in cluster.get("conditions") or []:
        if condition.get("type") != "ReplicaFailure" or condition.get("status") != "True":
            continue
        reason = condition.get("reason") or "ReplicaFailure"
        lines = [line for line in (condition.get("message") or "").splitlines() if line.strip() != reason]
        detail = " ".join(lines).strip() or reason
        which = "head pod" if "Head" in reason else "worker pods"
        since = _time(condition.get("lastTransitionTime"))
        quota = _QUOTA.search(detail)
        if quota is not None:
            return Stuck(
                "QuotaExceeded",
                f"KubeRay cannot create the job's {which}: {detail}. ResourceQuota {quota['quota']!r} "
                "refuses them: ask an administrator to raise it, or lower the job's resources; the pods are "
                "created when the quota has room.",
                since,
            )
        named = fields_named(detail, volume_fields)
        advice = (
            f"It comes from {' and '.join(named)} of this job: change {'them' if len(named) > 1 else 'it'}, "
            "or ask an administrator to allow it in this namespace."
            if named
            else "Change what the API server names (the job's resources, or the namespace's policy)."
        )
        return Stuck(
            "PodCreationRefused",
            f"KubeRay cannot create the job's {which}: {detail}. {advice}",
            since,
            stalls_at_once=True,
        )
    return None


def _pod_problems(pod: Mapping[str, Any], namespace: str) -> list[Stuck]:
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    created = _time(pod["metadata"].get("creationTimestamp"))
    head = (pod["metadata"].get("labels") or {}).get(LABEL_ROLE) == "head"
    what = f"the Ray head (pod {name})" if head else f"pod {name}"
    problems = []
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            said = (condition.get("message") or "no node fits").rstrip(".")
            problems.append(
                Stuck(
                    "Unschedulable",
                    f"{what} cannot be scheduled: {said}. It requests {_requests(pod)}: free or add nodes "
                    "that offer that, or lower the job's resources.",
                    _time(condition.get("lastTransitionTime")) or created,
                )
            )
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason not in REASONS:
            continue  # ContainerCreating, PodInitializing: still on its way
        detail = (waiting.get("message") or reason).rstrip(".")
        message = _container_message(what, name, container, detail, namespace)
        problems.append(Stuck(reason, message, created, reason in _AT_ONCE))
    return problems


def _container_message(what: str, pod: str, container: Mapping[str, Any], detail: str, namespace: str) -> str:
    name = container.get("name")
    reason = container["state"]["waiting"]["reason"]
    if reason in _IMAGE:
        return (
            f"{what} cannot pull image {container.get('image')!r} for container {name!r}: {detail}. Check "
            "spec.resources.image (registry, name, tag) and, for a private registry, "
            "spec.resources.imagePullSecrets."
        )
    if reason == "CreateContainerConfigError":
        return (
            f"{what} cannot start container {name!r}: {detail}. Create what it names in namespace "
            f"{namespace}; the pod starts when it exists."
        )
    if reason == "CrashLoopBackOff":
        last = (container.get("lastState") or {}).get("terminated") or {}
        ended = last.get("reason") or "an error"
        code = f", exit code {last['exitCode']}" if "exitCode" in last else ""
        said = f": {last['message'].strip()}" if (last.get("message") or "").strip() else ""
        hint = " (out of memory: give it more memory)" if ended == "OOMKilled" else ""
        return (
            f"{what} keeps crashing: container {name!r} restarted {container.get('restartCount', 0)} "
            f"times, last ended with {ended}{code}{said}{hint}. Its log says why: kubectl logs "
            f"--previous -n {namespace} {pod} -c {name}"
        )
    return f"{what} cannot run container {name!r}: {reason}: {detail}."


def _requests(pod: Mapping[str, Any]) -> str:
    totals: dict[str, str] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for resource, value in ((container.get("resources") or {}).get("requests") or {}).items():
            totals.setdefault(resource, str(value))  # Ray pods have one container that requests
    return ", ".join(f"{k}={v}" for k, v in sorted(totals.items())) or "no resources"


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


NODE_NOT_READY = "NodeNotReady"


@dataclass(frozen=True)
class NodeDown:
    """A node whose Ready condition is not True, as its condition says."""

    since: datetime | None
    reason: str  # NodeStatusUnknown (its kubelet stopped reporting), KubeletNotReady, ...
    message: str


def node_down(node: Mapping[str, Any]) -> NodeDown | None:
    """Whether a node is not Ready (False or Unknown); None when Ready, or not judged yet (no Ready
    condition: a node still registering)."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") != "Ready":
            continue
        if condition.get("status") == "True":
            return None
        return NodeDown(
            _time(condition.get("lastTransitionTime")),
            condition.get("reason") or "NotReady",
            (condition.get("message") or "").strip().rstrip("."),
        )
    return None


def not_ready(nodes: Iterable[Mapping[str, Any]]) -> dict[str, NodeDown]:
    """The nodes that are not Ready, by name."""
    down = {n["metadata"]["name"]: node_down(n) for n in nodes}
    return {name: state for name, state in down.items() if state is not None}


def node_trouble(
    pods: Iterable[Mapping[str, Any]], down: Mapping[str, NodeDown], namespace: str
) -> Stuck | None:
    """A running job's pods on nodes that are not Ready (the head first), or None."""
    hits = []
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node in down and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            head = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == "head"
            hits.append((not head, pod["metadata"]["name"], node, head))
    if not hits:
        return None
    hits.sort()
    _, name, node, head = hits[0]
    what = f"the Ray head (pod {name})" if head else f"pod {name}"
    others = len(hits) - 1
    also = f" ({others} other pod{'s' if others > 1 else ''} of the job on not-Ready nodes)" if others else ""
    state = down[node]
    since = f" since {state.since.strftime('%H:%M:%S')}" if state.since else ""
    said = state.message or state.reason
    return Stuck(
        NODE_NOT_READY,
        f"{what} is on node {node}, which is not Ready{since} ({state.reason}: {said}){also}. Its "
        "containers may still run, but Kubernetes cannot manage them: when the node is back the job "
        "goes on; if it stays down, the pods are evicted after their not-ready toleration (300 s by "
        f"default) and KubeRay creates them again where they fit. See: kubectl describe node {node}",
        state.since,
    )
