"""The operator beside the real Kueue controller (v0.17, built from its Go module and run by
tools/devcluster/kueue.py) with `manageJobsWithoutQueueName: true` and the RayJob integration, and
rljob-operator with --kueue-manage-jobs-without-queue-name:

- a job with spec.queueName is admitted by Kueue and runs; the operator never suspends it again;
- a job without one is suspended by Kueue's webhook and waits; neither side writes spec.suspend
  back and forth, nothing of it runs, and its status says why; setting spec.queueName admits it;
- a job without one in a namespace with a LocalQueue named "default" goes to that queue;
- spec.workloadPriorityClassName reaches the RayJob as kueue.x-k8s.io/priority-class and sets the
  priority of Kueue's Workload.

Kueue manages only the namespaces labelled as kueue.py says (state["kueue"]), so the other tests'
RayJobs are left alone. The runtime is replaced by a sleep through the rljob.dev/entrypoint
annotation, as in test_operator.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_process import OperatorProcess, wait_for

from rljob_api.resource import API_VERSION, KIND

from spec_cases import patched

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "tools" / "devcluster" / "devcluster.py"
KUEUE_BUILD_TIMEOUT_S = 3600  # a cold build of Kueue takes minutes on a small machine
SLEEP = "python -c 'import time; time.sleep(1800)'"
H100 = {
    "nodeSelector": {"rljob.dev/gpu-pool": "h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GATE_MANAGER = "rljob-operator-kueue-gate"


def _devcluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEVCLUSTER), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.fixture(scope="module")
def kueue(crd: Any) -> Iterator[dict[str, Any]]:
    """Kueue on the test cluster (started here unless running), a ResourceFlavor, a ClusterQueue
    with room for four 8-GPU jobs and a WorkloadPriorityClass, all removed afterwards."""
    t0 = time.monotonic()
    up = _devcluster("kueue", f"--name={crd.name}", timeout=KUEUE_BUILD_TIMEOUT_S)
    if up.returncode != 0:
        pytest.fail(f"devcluster kueue exited {up.returncode}:\n{up.stderr}\n{up.stdout}", pytrace=False)
    sys.stderr.write(f"\n[e2e] Kueue ready in {time.monotonic() - t0:.0f} s: {up.stdout.strip()}\n")
    started = "already running" not in up.stdout
    info = json.loads(_devcluster("status", "--json", f"--name={crd.name}", timeout=120).stdout)["state"][
        "kueue"
    ]
    suffix = uuid.uuid4().hex[:6]
    names = {
        "flavor": f"rljob-e2e-{suffix}",
        "cq": f"rljob-e2e-{suffix}",
        "priority": f"rljob-e2e-high-{suffix}",
    }
    objects = [
        _kueue_obj("ResourceFlavor", names["flavor"], {}),
        _kueue_obj(
            "ClusterQueue",
            names["cq"],
            {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": names["flavor"],
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100"},
                                    {"name": "memory", "nominalQuota": "1000Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "32"},
                                ],
                            }
                        ],
                    }
                ],
            },
        ),
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": names["priority"]},
            "value": 1000,
            "description": "rljob e2e",
        },
    ]
    crd.apply(*objects)
    label_key, label_value = info["managed_namespace_label"].split("=")
    namespaces: list[str] = []
    yield {**info, **names, "label": (label_key, label_value), "namespaces": namespaces}
    # Kueue removes its finalizers from Workloads and the ClusterQueue: let it, then stop it.
    for ns in namespaces:
        crd.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    for obj in reversed(objects):
        crd.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and crd.get("clusterqueue", names["cq"]) is not None:
        time.sleep(1)
    if started and os.environ.get("RLJOB_KEEP_CLUSTER") != "1":
        down = _devcluster("kueue", "--stop", f"--name={crd.name}", timeout=300)
        if down.returncode != 0:
            sys.stderr.write(f"[e2e] devcluster kueue --stop failed:\n{down.stdout}{down.stderr}\n")


def _kueue_obj(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": meta, "spec": spec}


@pytest.fixture(scope="module")
def operator(
    crd: Any, kueue: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        crd.kubeconfig,
        tmp_path_factory.mktemp("operator"),
        resync_seconds=2.0,  # many passes while the tests watch for a fight over spec.suspend
        args=("--secret-preflight", "--kueue-manage-jobs-without-queue-name"),
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def managed_namespace(crd: Any, kueue: dict[str, Any]) -> Iterator[Callable[..., str]]:
    """Makes a namespace Kueue manages, with LocalQueues of the module's ClusterQueue; deleted after
    the test, so its jobs give their GPUs back to the ClusterQueue and the fake nodes."""
    made: list[str] = []

    def make(*local_queues: str) -> str:
        ns = f"e2e-kueue-{uuid.uuid4().hex[:8]}"
        key, value = kueue["label"]
        crd.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {key: value}}})
        made.append(ns)
        kueue["namespaces"].append(ns)
        if local_queues:
            crd.apply(*(_kueue_obj("LocalQueue", q, {"clusterQueue": kueue["cq"]}, ns) for q in local_queues))
        return ns

    yield make
    for ns in made:
        crd.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def job(name: str, namespace: str, patch: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "annotations": {"rljob.dev/entrypoint": SLEEP}},
        "spec": patched({"resources": H100, **(patch or {})}),
    }


def status(crd: Any, ns: str, name: str) -> dict[str, Any]:
    return (crd.get("rljob", name, ns) or {}).get("status") or {}


def in_phase(crd: Any, ns: str, name: str, *phases: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        st = status(crd, ns, name)
        return st if st.get("phase") in phases else None

    return check


def ready(st: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == "Ready")


def rayjob(crd: Any, ns: str, name: str) -> dict[str, Any]:
    """The RayJob with its managedFields (kubectl hides them by default)."""
    out = crd.kubectl("get", "rayjob", name, "-n", ns, "-o", "json", "--show-managed-fields").stdout
    return json.loads(out)


def suspend_owners(obj: dict[str, Any]) -> set[str]:
    """The field managers that own spec.suspend."""
    return {
        m["manager"]
        for m in obj["metadata"].get("managedFields", [])
        if "f:suspend" in ((m.get("fieldsV1") or {}).get("f:spec") or {})
    }


def workload_of(crd: Any, ns: str, rayjob_uid: str) -> dict[str, Any] | None:
    for wl in crd.list("workloads.kueue.x-k8s.io", ns):
        if any(ref.get("uid") == rayjob_uid for ref in wl["metadata"].get("ownerReferences", [])):
            return wl
    return None


def watch_suspend(crd: Any, ns: str, name: str, seconds: float) -> list[tuple[int, bool]]:
    """(generation, spec.suspend) of the RayJob, sampled every half second."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        obj = crd.get("rayjob", name, ns)
        samples.append((obj["metadata"]["generation"], bool(obj["spec"].get("suspend"))))
        time.sleep(0.5)
    return samples


def test_a_job_with_a_queue_name_is_admitted_by_kueue_and_runs(
    crd: Any, kueue: dict[str, Any], operator: OperatorProcess, managed_namespace: Callable[..., str]
) -> None:
    ns = managed_namespace("team-a")
    crd.apply(job("queued", ns, {"queueName": "team-a"}))
    st = wait_for("Running", in_phase(crd, ns, "queued", "Running"), operator)
    assert st["queue"] == "team-a"
    obj = rayjob(crd, ns, "queued")
    # Kueue writes the RayJob with KubeRay's Go types: `suspend: false` is omitted (omitempty).
    assert not obj["spec"].get("suspend") and obj["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    wl = wait_for("its Workload admitted", lambda: workload_of(crd, ns, obj["metadata"]["uid"]), operator)
    assert wl["spec"]["queueName"] == "team-a"
    assert wl["status"]["admission"]["clusterQueue"] == kueue["cq"]
    # Kueue unsuspended it; rljob-operator does not own the field and never takes it back.
    assert "rljob-operator" not in suspend_owners(obj) and GATE_MANAGER not in suspend_owners(obj)
    samples = watch_suspend(crd, ns, "queued", 8)  # four resyncs of the operator
    assert {s for _, s in samples} == {False} and len({g for g, _ in samples}) == 1, samples
    assert crd.list("pods", ns, "rljob.dev/job=queued"), "admitted: its pods exist"


def test_a_job_without_a_queue_name_waits_for_kueue_without_a_fight(
    crd: Any, kueue: dict[str, Any], operator: OperatorProcess, managed_namespace: Callable[..., str]
) -> None:
    ns = managed_namespace("team-a")  # no LocalQueue named "default"
    crd.apply(job("unqueued", ns))
    st = wait_for("Queued", in_phase(crd, ns, "unqueued", "Queued"), operator)
    assert ready(st)["reason"] == "WaitingForKueue" and "no LocalQueue" in ready(st)["message"], st
    assert "queue" not in st
    obj = rayjob(crd, ns, "unqueued")
    assert obj["spec"]["suspend"] is True and QUEUE_LABEL not in obj["metadata"].get("labels", {})
    # Kueue made a Workload for it (no queue: it cannot be admitted) and holds it suspended.
    wl = wait_for("its Workload", lambda: workload_of(crd, ns, obj["metadata"]["uid"]), operator)
    assert not wl["spec"].get("queueName") and not (wl.get("status") or {}).get("admission")
    samples = watch_suspend(crd, ns, "unqueued", 10)  # five resyncs of the operator
    assert {s for _, s in samples} == {True}, samples
    assert len({g for g, _ in samples}) == 1, f"the RayJob's spec changed while it waited: {samples}"
    assert suspend_owners(rayjob(crd, ns, "unqueued")) == {GATE_MANAGER}
    # Nothing of it runs unadmitted.
    assert crd.list("pods", ns, "rljob.dev/job=unqueued") == []
    assert crd.list("rayclusters", ns) == []
    assert status(crd, ns, "unqueued")["phase"] == "Queued"
    # What the status tells to do works: name a queue, Kueue moves the Workload there and admits it.
    crd.kubectl(
        "patch", "rljob", "unqueued", "-n", ns, "--type=merge", "-p", '{"spec":{"queueName":"team-a"}}'
    )
    st = wait_for("Running once it names a queue", in_phase(crd, ns, "unqueued", "Running"), operator)
    assert st["queue"] == "team-a"
    assert rayjob(crd, ns, "unqueued")["metadata"]["labels"][QUEUE_LABEL] == "team-a"


def test_a_job_without_a_queue_name_goes_to_the_namespaces_default_local_queue(
    crd: Any, kueue: dict[str, Any], operator: OperatorProcess, managed_namespace: Callable[..., str]
) -> None:
    ns = managed_namespace("default")
    crd.apply(job("defaulted", ns))
    st = wait_for("Running", in_phase(crd, ns, "defaulted", "Running"), operator)
    assert st["queue"] == "default"  # the LocalQueue Kueue's webhook chose, read off the RayJob
    obj = rayjob(crd, ns, "defaulted")
    assert obj["metadata"]["labels"][QUEUE_LABEL] == "default" and not obj["spec"].get("suspend")


def test_the_priority_class_reaches_the_rayjob_and_kueues_workload(
    crd: Any, kueue: dict[str, Any], operator: OperatorProcess, managed_namespace: Callable[..., str]
) -> None:
    ns = managed_namespace("team-a")
    crd.apply(job("urgent", ns, {"queueName": "team-a", "workloadPriorityClassName": kueue["priority"]}))
    wait_for("Running", in_phase(crd, ns, "urgent", "Running"), operator)
    obj = rayjob(crd, ns, "urgent")
    assert obj["metadata"]["labels"][PRIORITY_LABEL] == kueue["priority"]
    wl = workload_of(crd, ns, obj["metadata"]["uid"])
    assert wl is not None and wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"]["name"] == kueue["priority"]
    assert wl["spec"]["priorityClassRef"]["kind"] == "WorkloadPriorityClass"
    # Kueue would refuse the RayJob without it from now on: the API server refuses the job's edit.
    removed = crd.kubectl(
        "patch", "rljob", "urgent", "-n", ns, "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/workloadPriorityClassName"}]',
        check=False,
    )  # fmt: skip
    assert removed.returncode != 0 and "workloadPriorityClassName cannot be removed" in removed.stderr


def test_a_higher_priority_job_preempts_a_training_job_which_resumes_from_its_preemption_checkpoint(
    crd: Any,
    kueue: dict[str, Any],
    operator: OperatorProcess,
    managed_namespace: Callable[..., str],
    tmp_path: Path,
) -> None:
    """A ClusterQueue with room for one job: a training job (the real runtime on a tiny model) runs;
    a job of a higher WorkloadPriorityClass arrives, and Kueue preempts the first by suspending its
    RayJob. The head pod's preStop hook (here tools/devcluster/prestop.py) gives the runtime SIGTERM:
    it saves the step it was in although saveInterval would not, and when the other job is done Kueue
    admits it again and it resumes from exactly that step."""
    from test_job_restart import ray_job_logs
    from test_operator import reached_step, tiny_training_job

    suffix = uuid.uuid4().hex[:6]
    cq, low, high = f"rljob-e2e-one-{suffix}", f"rljob-e2e-low-{suffix}", f"rljob-e2e-top-{suffix}"
    # One tiny job's pods: the head (2 CPUs, 8Gi) and a trainer (1 CPU, 2Gi).
    quota = [{"name": "cpu", "nominalQuota": "3"}, {"name": "memory", "nominalQuota": "10Gi"}]
    objects = [
        _kueue_obj(
            "ClusterQueue",
            cq,
            {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": kueue["flavor"], "resources": quota}],
                    }
                ],
            },
        ),
        *(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": "rljob e2e",
            }
            for name, value in ((low, 10), (high, 10000))
        ),
    ]
    crd.apply(*objects)
    try:
        ns = managed_namespace()
        crd.apply(_kueue_obj("LocalQueue", "one", {"clusterQueue": cq}, ns))
        total = 30
        training = tiny_training_job(tmp_path, "background", ns, num_rollout=total)
        training["spec"].update({"queueName": "one", "workloadPriorityClassName": low})
        training["spec"]["checkpoint"]["saveInterval"] = 1000  # only the preemption's save, and the last
        crd.apply(training)
        wait_for("step 2", reached_step(crd, ns, "background", 2), operator, timeout=420)
        first = crd.get("rayjob", "background", ns)

        urgent = tiny_training_job(tmp_path / "urgent", "urgent", ns, num_rollout=1)
        urgent["metadata"]["annotations"] = {
            "rljob.dev/entrypoint": "python -c 'import time; time.sleep(15)'"
        }
        urgent["spec"].update({"queueName": "one", "workloadPriorityClassName": high})
        crd.apply(urgent)
        wait_for(
            "the training job preempted", in_phase(crd, ns, "background", "Queued"), operator, timeout=120
        )
        wait_for("the urgent job done", in_phase(crd, ns, "urgent", "Succeeded"), operator, timeout=300)

        ckpt = Path(training["spec"]["checkpoint"]["path"])
        saved = sorted(int(p.name.split("_")[1]) for p in ckpt.glob("iter_*") if (p / "complete").exists())
        assert len(saved) == 1 and 2 <= saved[0] < total, saved
        logs = ray_job_logs(crd, first["status"]["jobId"])
        assert f"rljob-runtime: preempted after step {saved[0]};" in logs, logs[-3000:]

        st = wait_for(
            "the training job to finish",
            in_phase(crd, ns, "background", "Succeeded", "Failed"),
            operator,
            timeout=600,
        )
        assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
        second = crd.get("rayjob", "background", ns)
        assert f"resumed from step {saved[0]} " in ray_job_logs(crd, second["status"]["jobId"])
        assert st["progress"]["stepText"] == f"{total}/{total}"
    finally:
        for obj in reversed(objects):
            crd.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)
