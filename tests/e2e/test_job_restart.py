"""Whole-job restarts on the real API server, the real KubeRay and the local Ray: the runtime's
driver process is killed mid-run (what a lost head pod or a drained node does to it); the operator
records the restart with its reason, deletes the failed RayJob, creates a new one, and the new run
resumes from the latest checkpoint to Succeeded. A job the runtime refuses fails at once, without
a restart, whatever its backoffLimit."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from operator_process import OperatorProcess
from test_operator import condition, in_phase, reached_step, status, table, tiny_training_job, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def operator(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


def runtime_drivers(namespace: str, name: str) -> list[psutil.Process]:
    """The `rljob-runtime train` processes (the Ray job's driver, started by Ray's job supervisor
    through /bin/sh -c) of this job: its resolved config (RLJOB_JOB) names the job and namespace."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "train" not in cmdline or not any(Path(part).name == "rljob-runtime" for part in cmdline):
            continue
        try:
            config = json.loads(proc.environ().get("RLJOB_JOB", "{}"))
        except (psutil.Error, ValueError):
            continue
        if (
            config.get("metadata", {}).get("name") == name
            and config["metadata"].get("namespace") == namespace
        ):
            found.append(proc)
    return found


def ray_job_logs(crd: Any, job_id: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{crd.ray_dashboard}/api/jobs/{job_id}/logs", timeout=10) as resp:
        return json.loads(resp.read())["logs"]


def test_a_killed_driver_restarts_the_job_which_resumes_and_succeeds(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    total = 16
    doc = tiny_training_job(tmp_path, "comeback", namespace, num_rollout=total)
    doc["spec"]["faultTolerance"]["backoffLimit"] = 1
    crd.apply(doc)

    def checkpointed() -> dict[str, Any] | None:
        st = status(crd, namespace, "comeback")
        assert st.get("phase") not in ("Failed", "Succeeded"), json.dumps(st, indent=1)
        return st if (st.get("progress") or {}).get("lastCheckpointStep", 0) >= 1 else None

    wait_for("a first checkpoint", checkpointed, operator, timeout=420)
    first = crd.get("rayjob", "comeback", namespace)
    drivers = runtime_drivers(namespace, "comeback")
    assert len(drivers) == 1, drivers
    drivers[0].send_signal(signal.SIGKILL)
    killed_at = status(crd, namespace, "comeback")["progress"]["lastCheckpointStep"]
    assert killed_at < total, "the run finished before it could be killed: make numRollout larger"

    phases: list[tuple[str, str]] = []

    def finished() -> dict[str, Any] | None:
        st = status(crd, namespace, "comeback")
        shown = (st.get("phase", ""), condition(st, "Ready").get("reason", ""))
        if not phases or phases[-1] != shown:
            phases.append(shown)
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait_for("the restarted job to finish", finished, operator, timeout=600)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert st["restarts"] == 1
    (entry,) = st["restartHistory"]
    assert entry["attempt"] == 1 and entry["reason"] == "DriverKilled", entry
    assert entry["exitCode"] in (137, -9) and "SIGKILL" in entry["message"], entry
    assert entry["rayJobUid"] == first["metadata"]["uid"]
    # Back to Starting (Restarting, often too short to poll, then Starting), Running, Succeeded.
    shown = [phase for phase, _ in phases]
    starting = shown.index("Starting") if "Starting" in shown else len(shown)
    assert "Running" in shown[starting:] and shown[-1] == "Succeeded", phases

    # A new RayJob (new uid, new Ray job) ran the second attempt, which resumed from a checkpoint.
    second = crd.get("rayjob", "comeback", namespace)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["status"]["jobId"] != first["status"]["jobId"] and second["spec"]["backoffLimit"] == 0
    logs = ray_job_logs(crd, second["status"]["jobId"])
    resumed = [line for line in logs.splitlines() if line.startswith("resumed from step ")]
    assert resumed, logs[-3000:]
    step = int(resumed[0].split()[3])
    assert killed_at <= step < total, (killed_at, resumed)
    assert st["progress"]["stepText"] == f"{total}/{total}"
    assert (tmp_path / "ckpt" / f"iter_{total:07d}" / "complete").exists()

    warnings = [
        e
        for e in crd.list("events", namespace)
        if e["involvedObject"]["name"] == "comeback" and e["reason"] == "Restarting"
    ]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
    assert warnings[0]["message"].startswith("Running -> Starting: restart 1 of 1 after DriverKilled: ")
    # The runtime's own word that the second attempt resumed, at the step its log names.
    resumed_events = [
        e
        for e in crd.list("events", namespace)
        if e["involvedObject"]["name"] == "comeback" and e["reason"] == "Resumed"
    ]
    assert [e["message"].split(" (")[0] for e in resumed_events] == [f"resumed from step {step}"], (
        resumed_events
    )
    assert (
        resumed_events[0]["type"] == "Normal" and resumed_events[0]["source"]["component"] == "rljob-runtime"
    )
    described = crd.kubectl("describe", "rljob", "comeback", "-n", namespace).stdout
    assert "Restart History" in described and "DriverKilled" in described, described
    (row,) = table(crd.kubectl("get", "rljobs", "-n", namespace).stdout)
    assert row["PHASE"] == "Succeeded"
    if os.environ.get("RLJOB_E2E_DEBUG"):
        print(described)


def test_a_sigterm_preempts_the_job_which_resumes_from_its_last_step_without_counting_a_failure(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """What the head pod's preStop hook (`rljob-runtime stop`) does when the pod goes away: the
    runtime gets SIGTERM. The step in flight finishes and is saved (saveInterval would not save it),
    the runtime exits 75, and the operator restarts the job as Preempted although backoffLimit is 0;
    the new run resumes from exactly that step. (The hook's command on a real process:
    tests/unit/test_preemption.py; it signals every train process of its pod, and this machine may
    run other tests' drivers.)"""
    total = 20
    doc = tiny_training_job(tmp_path, "preempted", namespace, num_rollout=total)
    doc["spec"]["checkpoint"]["saveInterval"] = 1000  # only the preemption's save, and the last
    crd.apply(doc)
    wait_for("step 2", reached_step(crd, namespace, "preempted", 2), operator, timeout=420)
    first = crd.get("rayjob", "preempted", namespace)
    (driver,) = runtime_drivers(namespace, "preempted")
    driver.send_signal(signal.SIGTERM)

    def finished() -> dict[str, Any] | None:
        st = status(crd, namespace, "preempted")
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait_for("the preempted job to finish", finished, operator, timeout=600)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert (st["restarts"], st["preemptions"]) == (1, 1)
    (entry,) = st["restartHistory"]
    assert (entry["reason"], entry["exitCode"]) == ("Preempted", 75), entry
    assert entry["rayJobUid"] == first["metadata"]["uid"]
    preempted_at = int(entry["message"].split("preempted after step ")[1].split(";")[0])
    assert 2 <= preempted_at < total, entry
    second = crd.get("rayjob", "preempted", namespace)
    logs = ray_job_logs(crd, second["status"]["jobId"])
    assert f"resumed from step {preempted_at} " in logs, logs[-3000:]  # that step, not an earlier one
    assert st["progress"]["stepText"] == f"{total}/{total}"
    events = [
        e
        for e in crd.list("events", namespace)
        if e["involvedObject"]["name"] == "preempted" and e["reason"] == "Restarting"
    ]
    assert len(events) == 1, events
    assert "after Preempted (not counted against backoffLimit 0)" in events[0]["message"], events


def test_a_suspended_job_saves_its_step_and_resumes_from_it(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """`spec.suspend: true` on a training job (what Kueue does to preempt it): KubeRay deletes the
    Ray cluster, the head pod's preStop hook (here its stand-in, tools/devcluster/prestop.py) sends
    the runtime SIGTERM, and it saves the step it was in although saveInterval would not. Resumed,
    the job goes on from exactly that step, with no restart counted."""
    total = 20
    doc = tiny_training_job(tmp_path, "suspended", namespace, num_rollout=total)
    doc["spec"]["checkpoint"]["saveInterval"] = 1000  # only the preemption's save, and the last
    crd.apply(doc)
    wait_for("step 2", reached_step(crd, namespace, "suspended", 2), operator, timeout=420)
    first = crd.get("rayjob", "suspended", namespace)
    (driver,) = runtime_drivers(namespace, "suspended")

    def patch_suspend(value: bool) -> None:
        patch = json.dumps({"spec": {"suspend": value}})
        crd.kubectl("patch", "rljob", "suspended", "-n", namespace, "--type=merge", "-p", patch)

    patch_suspend(True)
    wait_for("Suspended", in_phase(crd, namespace, "suspended", "Suspended"), operator, timeout=120)
    wait_for("the runtime to exit", lambda: not driver.is_running() or None, operator, timeout=120)
    saved = sorted(
        int(p.name.split("_")[1]) for p in (tmp_path / "ckpt").glob("iter_*") if (p / "complete").exists()
    )
    assert len(saved) == 1 and 2 <= saved[0] < total, saved
    logs = ray_job_logs(crd, first["status"]["jobId"])
    assert f"rljob-runtime: preempted after step {saved[0]};" in logs, logs[-3000:]

    patch_suspend(False)

    def finished() -> dict[str, Any] | None:
        st = status(crd, namespace, "suspended")
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait_for("the resumed job to finish", finished, operator, timeout=600)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert not st.get("restarts") and not st.get("preemptions")  # a suspend is no restart
    second = crd.get("rayjob", "suspended", namespace)
    logs = ray_job_logs(crd, second["status"]["jobId"])
    assert f"resumed from step {saved[0]} " in logs, logs[-3000:]
    assert st["progress"]["stepText"] == f"{total}/{total}"


def test_a_job_the_runtime_refuses_fails_without_a_restart(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    doc = tiny_training_job(tmp_path, "refused", namespace, num_rollout=2)
    good_data = doc["spec"]["data"]["path"]
    doc["spec"]["data"]["path"] = str(tmp_path / "missing.jsonl")
    doc["spec"]["faultTolerance"]["backoffLimit"] = 2
    crd.apply(doc)
    st = wait_for("Failed", in_phase(crd, namespace, "refused", "Succeeded", "Failed"), operator, timeout=300)
    assert st["phase"] == "Failed", json.dumps(st, indent=1)
    assert not st.get("restarts") and not st.get("restartHistory")
    ready, failed = condition(st, "Ready"), condition(st, "Failed")
    assert ready["reason"] == failed["reason"] == "InvalidJob", st
    assert "missing.jsonl: no such file" in ready["message"], ready
    assert "exit code 78" in failed["message"], failed
    time.sleep(8)  # a resync or two later: still one RayJob, never deleted or re-created
    rayjob = crd.get("rayjob", "refused", namespace)
    assert rayjob is not None and rayjob["status"].get("failed", 0) <= 1
    assert status(crd, namespace, "refused")["phase"] == "Failed"
    events = [e for e in crd.list("events", namespace) if e["involvedObject"]["name"] == "refused"]
    assert not [e for e in events if e["reason"] == "Restarting"]
    assert sum(e["reason"] == "Created" for e in events) == 1

    # What the user guide says to do after a final failure: fix the spec, delete and create the job
    # again (kubectl replace --force; GitOps tools do the same). The new job does not inherit the
    # old one's Failed RayJob, it runs.
    doc["spec"]["data"]["path"] = good_data
    manifest = tmp_path / "refused-fixed.json"
    manifest.write_text(json.dumps(doc))
    crd.kubectl("replace", "--force", "-f", str(manifest))
    fixed = wait_for(
        "the fixed job to finish",
        in_phase(crd, namespace, "refused", "Succeeded", "Failed"),
        operator,
        timeout=420,
    )
    assert fixed["phase"] == "Succeeded", json.dumps(fixed, indent=1)
    job = crd.get("rljob", "refused", namespace)
    rayjob = crd.get("rayjob", "refused", namespace)
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
