"""The operator end to end: a real API server, scheduler and garbage collector (kwok nodes), the
real KubeRay operator, RayJobs whose entrypoints run on the local Ray, and rljob-operator as a
process. The runtime itself is replaced by small commands through the rljob.dev/entrypoint
annotation, so these tests exercise exactly what the operator owns."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_process import OperatorProcess, wait_for

from rljob_api.resource import API_VERSION, KIND

from spec_cases import patched

pytestmark = pytest.mark.e2e

SLEEP = "python -c 'import time; time.sleep(1800)'"
H100 = {
    "nodeSelector": {"rljob.dev/gpu-pool": "h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


@pytest.fixture(scope="module")
def operator(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


def job(name: str, patch: dict[str, Any] | None = None, entrypoint: str | None = SLEEP) -> dict[str, Any]:
    spec = patched({"resources": H100, **(patch or {})})
    meta: dict[str, Any] = {"name": name}
    if entrypoint:
        meta["annotations"] = {"rljob.dev/entrypoint": entrypoint}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


def status(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    obj = cluster.get("rljob", name, ns)
    return (obj or {}).get("status") or {}


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == kind), {})


def in_phase(cluster: Any, ns: str, name: str, *phases: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        st = status(cluster, ns, name)
        return st if st.get("phase") in phases else None

    return check


def test_gpu_job_runs_on_kuberay_with_pods_placed_by_the_scheduler(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    spec = {
        "resources": {
            "colocate": False,
            "tolerations": H100["tolerations"],
            "trainer": {"nodes": 1, "gpusPerNode": 8, "nodeSelector": {"rljob.dev/gpu-pool": "h100"}},
            "rollout": {
                "gpus": 8,
                "gpusPerNode": 4,
                "gpusPerEngine": 2,
                "nodeSelector": {"rljob.dev/gpu-pool": "l4"},
            },
        }
    }
    crd.apply(_in(namespace, job("disagg", spec)))
    st = wait_for("phase Running", in_phase(crd, namespace, "disagg", "Running"), operator)
    assert st["gpus"] == 16 and condition(st, "Ready")["status"] == "True"
    rayjob = crd.get("rayjob", "disagg", namespace)
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert set(groups) == {"trainer", "rollout"}
    assert rayjob["metadata"]["ownerReferences"][0]["kind"] == KIND
    # Written once: KubeRay's writes (its finalizer) leave the spec as the operator applied it, so the
    # operator never applies it again (they used to move its generation: a second apply per RayJob).
    assert rayjob["metadata"]["generation"] == 1
    pods = crd.list("pods", namespace, "rljob.dev/job=disagg")
    nodes = {p["metadata"]["labels"]["rljob.dev/role"]: [] for p in pods}
    for p in pods:
        nodes[p["metadata"]["labels"]["rljob.dev/role"]].append(p["spec"].get("nodeName", ""))
    assert len(nodes["trainer"]) == 1 and nodes["trainer"][0].startswith("gpu-h100")
    assert len(nodes["rollout"]) == 2 and all(n.startswith("gpu-l4") for n in nodes["rollout"])
    assert st["children"]["rayCluster"] == rayjob["status"]["rayClusterName"]
    # kubectl shows it, and describe lists the events.
    (row,) = table(crd.kubectl("get", "rljobs", "-n", namespace).stdout)
    assert (row["NAME"], row["PHASE"], row["GPUS"], row["STEP"]) == ("disagg", "Running", "16", "")
    described = crd.kubectl("describe", "rljob", "disagg", "-n", namespace).stdout
    assert "Created" in described and "-> Running" in described


def test_job_outcome_maps_to_succeeded_and_failed(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    crd.apply(
        _in(namespace, job("ok", entrypoint="true")),
        _in(
            namespace,
            job("bad", entrypoint="python -c 'import sys; print(\"reward function crashed\"); sys.exit(3)'"),
        ),
    )
    ok = wait_for("Succeeded", in_phase(crd, namespace, "ok", "Succeeded"), operator)
    assert condition(ok, "Succeeded")["status"] == "True" and ok.get("completionTime")
    bad = wait_for("Failed", in_phase(crd, namespace, "bad", "Failed"), operator)
    failed = condition(bad, "Failed")
    assert failed["status"] == "True" and condition(bad, "Stalled")["status"] == "True"
    assert failed["reason"] and "RayJob bad" in failed["message"]


def test_quota_admits_whole_gangs_in_order(crd: Any, operator: OperatorProcess, namespace: str) -> None:
    crd.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": "24"}},
        }
    )
    # 8 trainer + 8 rollout GPUs (two colocated cuda nodes are not supported: api/rljob_api/support.py)
    sixteen = {
        "resources": {**H100, "colocate": False, "trainer": {"gpusPerNode": 8}, "rollout": {"gpus": 8}}
    }
    crd.apply(_in(namespace, job("first", sixteen)))
    wait_for("first Running", in_phase(crd, namespace, "first", "Running", "Starting"), operator)
    crd.apply(_in(namespace, job("second", sixteen)))
    queued = wait_for("second Queued", in_phase(crd, namespace, "second", "Queued"), operator)
    assert condition(queued, "Queued")["reason"] == "InsufficientQuota"
    assert "needs 16 nvidia.com/gpu" in condition(queued, "Queued")["message"]
    time.sleep(5)  # a resync or two later it is still not (even partly) created
    assert crd.get("rayjob", "second", namespace) is None
    assert crd.get("serviceaccount", "second-runtime", namespace) is None
    assert crd.list("pods", namespace, "rljob.dev/job=second") == []
    crd.kubectl("delete", "rljob", "first", "-n", namespace, "--wait=false")
    wait_for(
        "second admitted", in_phase(crd, namespace, "second", "Starting", "Running"), operator, timeout=180
    )
    assert crd.get("rayjob", "second", namespace) is not None


def test_suspend_frees_gpus_and_resume_restarts(crd: Any, operator: OperatorProcess, namespace: str) -> None:
    crd.apply(_in(namespace, job("pausable")))
    wait_for("Running", in_phase(crd, namespace, "pausable", "Running"), operator)
    crd.kubectl(
        "patch",
        "rljob",
        "pausable",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"suspend": True}}),
    )
    st = wait_for("Suspended", in_phase(crd, namespace, "pausable", "Suspended"), operator)
    assert condition(st, "Suspended")["status"] == "True"
    wait_for(
        "pods gone", lambda: crd.list("pods", namespace, "rljob.dev/job=pausable") == [] or None, operator
    )
    assert crd.get("rayjob", "pausable", namespace)["spec"]["suspend"] is True
    crd.kubectl(
        "patch",
        "rljob",
        "pausable",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"suspend": False}}),
    )
    wait_for("Running again", in_phase(crd, namespace, "pausable", "Running"), operator, timeout=180)


def wait_children_deleted(
    crd: Any, namespace: str, job: str, ray_cluster: str, operator: OperatorProcess
) -> None:
    """Every child of a deleted job goes (garbage collection through owner references)."""
    for kind, name in [
        ("rayjob", job),
        ("raycluster", ray_cluster),
        ("serviceaccount", f"{job}-runtime"),
        ("role", f"{job}-runtime"),
        ("rolebinding", f"{job}-runtime"),
    ]:
        wait_for(
            f"{kind} {name} deleted",
            lambda k=kind, n=name: crd.get(k, n, namespace) is None or None,
            operator,
        )
    wait_for(
        "pods deleted", lambda: crd.list("pods", namespace, f"rljob.dev/job={job}") == [] or None, operator
    )


def test_delete_cascades_to_every_child(crd: Any, operator: OperatorProcess, namespace: str) -> None:
    crd.apply(_in(namespace, job("doomed")))
    st = wait_for("Running", in_phase(crd, namespace, "doomed", "Running"), operator)
    cluster_name = st["children"]["rayCluster"]
    crd.kubectl("delete", "rljob", "doomed", "-n", namespace)
    wait_children_deleted(crd, namespace, "doomed", cluster_name, operator)


def test_a_rayjob_deleted_by_hand_is_recreated_with_a_warning(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    crd.apply(_in(namespace, job("orphaned")))
    wait_for("Running", in_phase(crd, namespace, "orphaned", "Running"), operator)
    first = crd.get("rayjob", "orphaned", namespace)["metadata"]["uid"]
    crd.kubectl("delete", "rayjob", "orphaned", "-n", namespace, "--wait=false")

    def recreated() -> dict[str, Any] | None:
        events = crd.list("events", namespace)
        return next((e for e in events if e["reason"] == "Recreated"), None)

    # KubeRay stops the Ray job and removes the Ray cluster before the RayJob is gone.
    event = wait_for("the Recreated event", recreated, operator, timeout=180)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "orphaned"
    assert event["message"].startswith("RayJob orphaned was deleted, not by this operator; recreated it")
    assert crd.get("rayjob", "orphaned", namespace)["metadata"]["uid"] != first
    assert "Recreated" in crd.kubectl("describe", "rljob", "orphaned", "-n", namespace).stdout


def test_operator_restart_mid_flight_changes_nothing(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    crd.apply(_in(namespace, job("steady")))
    before = wait_for("Running", in_phase(crd, namespace, "steady", "Running"), operator)
    rayjob_uid = crd.get("rayjob", "steady", namespace)["metadata"]["uid"]
    operator.kill()
    crd.apply(_in(namespace, job("while-down")))  # created while no operator runs
    operator.start()
    wait_for("new job reconciled", in_phase(crd, namespace, "while-down", "Running", "Starting"), operator)
    time.sleep(8)  # a resync after the restart
    after = status(crd, namespace, "steady")
    assert after["phase"] == "Running" and after["conditions"] == before["conditions"]
    assert crd.get("rayjob", "steady", namespace)["metadata"]["uid"] == rayjob_uid
    assert len(crd.list("rayclusters", namespace, "ray.io/originated-from-crd=RayJob")) == 2


def test_jobs_that_cannot_run_say_why_and_create_nothing(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    # A name too long for the RayJob is refused by the CRD itself (test_stuck_jobs.py).
    crd.apply(
        _in(
            namespace,
            job(
                "too-big",
                {
                    "resources": {**H100, "trainer": {"nodes": 1, "gpusPerNode": 16}},
                    "training": {"globalBatchSize": 256},
                },
            ),
        ),
        _in(
            namespace,
            job(
                "no-secret",
                {"resources": {**H100, "secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}}}},
            ),
        ),
    )
    too_big = wait_for(
        "NoNodeFits",
        lambda: (
            condition(status(crd, namespace, "too-big"), "Stalled").get("reason") == "NoNodeFits"
            and status(crd, namespace, "too-big")
        ),
        operator,
    )
    assert "needs 16 nvidia.com/gpu per pod" in condition(too_big, "Stalled")["message"]
    stalled = wait_for(
        "SecretNotFound",
        lambda: (
            condition(status(crd, namespace, "no-secret"), "Stalled").get("status") == "True"
            and status(crd, namespace, "no-secret")
        ),
        operator,
    )
    assert "'hf'" in condition(stalled, "Stalled")["message"]
    for name in ("too-big", "no-secret"):
        assert crd.get("rayjob", name, namespace) is None
    # Creating the secret lets the stalled job go on.
    crd.kubectl("create", "secret", "generic", "hf", "--from-literal=token=x", "-n", namespace)
    wait_for("no-secret starts", in_phase(crd, namespace, "no-secret", "Starting", "Running"), operator)
    warnings = crd.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "type=Warning", "-o", "json"
    ).stdout
    assert "NoNodeFits" in warnings


def test_metrics_count_reconciles_and_phases(crd: Any, operator: OperatorProcess) -> None:
    text = wait_for(
        "metrics",
        lambda: "rljob_operator_reconcile_total" in operator.metrics() and operator.metrics(),
        operator,
    )
    ok = [
        line for line in text.splitlines() if line.startswith('rljob_operator_reconcile_total{result="ok"}')
    ]
    assert ok and float(ok[0].split()[-1]) > 0
    assert (
        'rljob_operator_jobs{phase="Running"}' in text and "rljob_operator_reconcile_seconds_bucket" in text
    )


def table(text: str) -> list[dict[str, str]]:
    """kubectl's table output as rows of {column: value}, cut at the header's column starts (empty cells stay empty)."""
    header, *rows = text.splitlines()
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    names = [header[a:b].strip() for a, b in bounds]
    return [{n: row[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)} for row in rows]


def _in(namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    return obj


def test_mutable_spec_changes_reach_the_rayjob_and_spec_is_never_written(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    crd.apply(_in(namespace, job("tunable")))
    wait_for("Running", in_phase(crd, namespace, "tunable", "Running"), operator)
    patch = {"spec": {"activeDeadlineSeconds": 7200, "training": {"numRollout": 500}}}
    crd.kubectl("patch", "rljob", "tunable", "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def updated() -> dict[str, Any] | None:
        spec = crd.get("rayjob", "tunable", namespace)["spec"]
        return (
            spec
            if spec.get("activeDeadlineSeconds") == 7200
            and '\\"numRollout\\":500' in json.dumps(spec["runtimeEnvYAML"])
            else None
        )

    wait_for("RayJob updated", updated, operator)
    obj = json.loads(
        crd.kubectl("get", "rljob", "tunable", "-n", namespace, "-o", "json", "--show-managed-fields").stdout
    )
    writers = {(m["manager"], m.get("subresource", "")) for m in obj["metadata"]["managedFields"]}
    assert ("rljob-operator", "status") in writers
    assert not any(manager == "rljob-operator" and sub != "status" for manager, sub in writers), writers


def test_kueue_jobs_wait_suspended_and_follow_admission(
    crd: Any, operator: OperatorProcess, namespace: str
) -> None:
    # Kueue itself is not part of the harness: this test makes the one write Kueue makes on
    # admission (RayJob spec.suspend -> false) and checks the operator follows instead of fighting it.
    crd.apply(_in(namespace, job("queued", {"queueName": "team-a"})))
    st = wait_for("WaitingForKueue", in_phase(crd, namespace, "queued", "Queued"), operator)
    assert condition(st, "Queued")["reason"] == "WaitingForKueue" and st["queue"] == "team-a"
    rayjob = crd.get("rayjob", "queued", namespace)
    assert rayjob["spec"]["suspend"] is True
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert crd.list("pods", namespace, "rljob.dev/job=queued") == []
    crd.kubectl(
        "patch",
        "rayjob",
        "queued",
        "-n",
        namespace,
        "--type=merge",
        "--field-manager=kueue-admission",
        "-p",
        json.dumps({"spec": {"suspend": False}}),
    )
    wait_for("Running after admission", in_phase(crd, namespace, "queued", "Running"), operator, timeout=180)
    time.sleep(6)  # a resync later the operator has not suspended it again
    assert crd.get("rayjob", "queued", namespace)["spec"]["suspend"] is False


def test_runtime_reports_progress_with_its_own_least_privilege_identity(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Any
) -> None:
    from rljob_runtime.report import JobIdentity, ProgressReporter

    crd.apply(_in(namespace, job("reporter")), _in(namespace, job("neighbour")))
    wait_for("Running", in_phase(crd, namespace, "reporter", "Running"), operator)
    wait_for("neighbour Running", in_phase(crd, namespace, "neighbour", "Running"), operator)
    # The runtime runs as the ServiceAccount the operator made for it: build its kubeconfig.
    token = crd.kubectl("create", "token", "reporter-runtime", "-n", namespace).stdout.strip()
    admin = json.loads(crd.kubectl("config", "view", "--raw", "-o", "json").stdout)
    admin["users"] = [{"name": "runtime", "user": {"token": token}}]
    admin["contexts"] = [
        {"name": "runtime", "context": {"cluster": admin["clusters"][0]["name"], "user": "runtime"}}
    ]
    admin["current-context"] = "runtime"
    kubeconfig = tmp_path / "runtime-kubeconfig"
    kubeconfig.write_text(json.dumps(admin))
    import io
    import os

    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        reporter = ProgressReporter(
            10, job=JobIdentity("reporter", namespace), tensorboard_dir=None, stream=io.StringIO()
        )
        reporter.step(
            3,
            {"reward/mean": 0.4567, "reward/std": 0.1, "time/step": 12.0},
            checkpoint=(3, "/ckpt/iter_0000003"),
        )
        outsider = ProgressReporter(
            10, job=JobIdentity("neighbour", namespace), tensorboard_dir=None, stream=io.StringIO()
        )
        outsider.step(1, {"reward/mean": 1.0})  # not its job: refused, logged, not raised
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG")
        else:
            os.environ["KUBECONFIG"] = old
    st = status(crd, namespace, "reporter")
    assert st["progress"]["stepText"] == "3/10" and st["progress"]["rewardMean"] == 0.4567
    assert st["progress"]["lastCheckpoint"] == "/ckpt/iter_0000003" and st["progress"]["etaSeconds"] == 84
    assert "progress" not in status(crd, namespace, "neighbour")
    (row,) = [
        r for r in table(crd.kubectl("get", "rljobs", "-n", namespace).stdout) if r["NAME"] == "reporter"
    ]
    assert (row["STEP"], row["REWARD"]) == ("3/10", "0.4567")
    # The operator's next passes keep the runtime's progress and show it in the Ready message.
    ready = wait_for(
        "message shows progress",
        lambda: (
            "step 3/10" in condition(status(crd, namespace, "reporter"), "Ready")["message"]
            and status(crd, namespace, "reporter")
        ),
        operator,
    )
    assert ready["progress"]["step"] == 3


def tiny_training_job(tmp_path: Path, name: str, namespace: str, num_rollout: int) -> dict[str, Any]:
    """An RLTrainingJob running the real runtime (no entrypoint override) on a random-weight tiny
    model: seconds per step on CPU."""
    from rljob_runtime.models.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", arch="llama", seed=0)
    data = Path(__file__).resolve().parents[2] / "examples" / "data" / "add-1digit.jsonl"
    spec = {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {"path": str(data), "applyChatTemplate": False},
        "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2, "maxResponseLen": 4},
        "training": {
            "backend": "torch",
            "numRollout": num_rollout,
            "globalBatchSize": 4,
            "microBatchSize": 2,
        },
        "resources": {
            "device": "cpu",
            "trainer": {"nodes": 1, "gpusPerNode": 1, "cpu": "1", "memory": "2Gi"},
        },
        "checkpoint": {"path": str(tmp_path / "ckpt"), "saveInterval": 1, "maxToKeep": 2},
        "faultTolerance": {"engineHealthCheck": {"firstWaitSeconds": 120}},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def reached_step(crd: Any, namespace: str, name: str, step: int) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        st = status(crd, namespace, name)
        assert st.get("phase") not in ("Failed", "Succeeded"), json.dumps(st, indent=1)
        return st if (st.get("progress") or {}).get("step", 0) >= step else None

    return check


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line or environment contains ``text`` (ours: same user)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def ray_job_status(cluster: Any, job_id: str) -> str | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{cluster.ray_dashboard}/api/jobs/{job_id}", timeout=5) as resp:
            return json.loads(resp.read())["status"]
    except OSError:
        return None


def test_a_cpu_job_really_trains_to_succeeded(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Any
) -> None:
    """No entrypoint override: the RayJob runs `rljob-runtime train --config env:RLJOB_JOB` on the
    local Ray (a random-weight tiny model, two steps), reports progress and checkpoints."""
    crd.apply(tiny_training_job(tmp_path, "tiny-grpo", namespace, num_rollout=2))
    phases: list[str] = []

    def finished() -> dict[str, Any] | None:
        st = status(crd, namespace, "tiny-grpo")
        if st.get("phase") and (not phases or phases[-1] != st["phase"]):
            phases.append(st["phase"])
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait_for("the job to finish", finished, operator, timeout=420)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert "Running" in phases or "Starting" in phases, phases
    progress = st["progress"]
    assert progress["stepText"] == "2/2" and progress["lastCheckpointStep"] == 2
    assert (tmp_path / "ckpt" / "iter_0000002" / "complete").exists()
    assert (tmp_path / "ckpt" / "iter_0000002" / "model" / "config.json").exists()


def test_operator_killed_mid_training_changes_nothing(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """SIGKILL the operator while the runtime trains, start it again: the same RayJob and Ray job
    go on (no retry, no second submission) and the job reaches Succeeded with every step done."""
    total = 12
    crd.apply(tiny_training_job(tmp_path, "survivor", namespace, num_rollout=total))
    wait_for("step 2", reached_step(crd, namespace, "survivor", 2), operator, timeout=420)
    rayjob = crd.get("rayjob", "survivor", namespace)
    operator.kill()
    time.sleep(5)  # the runtime keeps training and reporting while no operator runs
    operator.start()
    st = wait_for(
        "Succeeded", in_phase(crd, namespace, "survivor", "Succeeded", "Failed"), operator, timeout=420
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    after = crd.get("rayjob", "survivor", namespace)
    assert after["metadata"]["uid"] == rayjob["metadata"]["uid"]
    assert after["status"]["jobId"] == rayjob["status"]["jobId"]
    assert after["status"].get("failed", 0) == 0 and not st.get("restarts")
    assert st["progress"]["stepText"] == f"{total}/{total}"
    assert ray_job_status(crd, after["status"]["jobId"]) == "SUCCEEDED"
    described = crd.kubectl("describe", "rljob", "survivor", "-n", namespace).stdout
    assert "Retrying" not in described, described


def test_deleting_a_training_job_stops_the_ray_job_and_removes_its_children(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """`kubectl delete rljob` mid-run: KubeRay stops the Ray job (the runtime's engines, router and
    trainer processes exit) and garbage collection removes every child."""
    crd.apply(tiny_training_job(tmp_path, "cancelled", namespace, num_rollout=500))
    st = wait_for("step 1", reached_step(crd, namespace, "cancelled", 1), operator, timeout=420)
    job_id = crd.get("rayjob", "cancelled", namespace)["status"]["jobId"]
    assert ray_job_status(crd, job_id) == "RUNNING"
    marker = str(tmp_path / "tiny")  # the model path: in the runtime's config and the engines' command lines
    assert processes_mentioning(marker), "the runtime's processes should be running"
    crd.kubectl("delete", "rljob", "cancelled", "-n", namespace)
    wait_children_deleted(crd, namespace, "cancelled", st["children"]["rayCluster"], operator)
    wait_for("the Ray job stopped", lambda: ray_job_status(crd, job_id) == "STOPPED" or None, operator)
    wait_for(
        "the runtime's processes gone", lambda: not processes_mentioning(marker) or None, operator, timeout=90
    )
    steps_at_stop = status(crd, namespace, "cancelled")
    assert steps_at_stop == {}  # the job itself is gone
