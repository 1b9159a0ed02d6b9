"""`make demo` exactly as a user runs it, on the real-pod tier's cluster (the demo's own, with a real
node): it builds or reuses the images, installs the operator with its Helm chart and runs the CPU GRPO
job in real pods. KubeRay creates the Ray head and worker pods from the runtime-cpu image on the real
node, in a namespace that enforces `restricted`, and submits the runtime through the head's Service
(HTTPMode, the default submission mode). The model and the data come from a PersistentVolume on the
node, the checkpoints go to another; the runtime writes the job's progress from inside the head pod
with its own ServiceAccount; its NetworkPolicy, enforced by kube-router on the node, keeps other pods
away from the head.

On the way its head pod is deleted, then its driver killed, then the node's kubelet stopped; a second
`make demo` attaches to the running job instead of applying it again. The job must reach Succeeded,
having lost at most the steps since its last checkpoint, with its reward rising (tests/learning.py's
criterion): this is CI's learning proof, the only test that trains the demo config. At the end
`make demo-down` removes the job, its volumes and the operator. One job carries every check: each
start of it costs minutes on two cores."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.conftest import Cluster
from learning import learned
from real_pods import pod, wait_for, wait_phase

pytestmark = pytest.mark.realpods

REPO = Path(__file__).resolve().parents[2]
NODE = "real-0"
NAMESPACE, JOB = "rljob-demo", "grpo-cpu-demo"  # the demo's (tools/rljob_demo)
STEPS = 10  # the demo's: learning's criterion compares the first 2 steps with the last 5
# Starting (image on the node, Ray up) about 1 min, each step 40-80 s on two shared cores, and a
# new start after each fault.
TIMEOUT_S = 1800


class Demo:
    """`make demo` (or another demo target) on the tier's cluster, its output collected line by line."""

    def __init__(self, cluster: Cluster, target: str, *extra: str) -> None:
        env = {**os.environ, "RLJOB_CLUSTER": cluster.name}
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", target, *extra],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"{self.proc.args} did not finish in {timeout:.0f} s:\n{self.output}", pytrace=False)
        self.reader.join(timeout=10)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def running(self) -> bool:
        """True while it runs; fails the test with its output when it ended early."""
        if self.proc.poll() is None:
            return True
        self.reader.join(timeout=10)
        pytest.fail(f"{self.proc.args} ended early ({self.proc.returncode}):\n{self.output}", pytrace=False)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def step_column(output: str) -> list[int]:
    """The STEP values of the live view's rows (`1:05   grpo-cpu-demo   Running   Running   3/10   0.41 ...`):
    PHASE, then REASON (empty while the job has no Ready condition), then STEP."""
    return [int(m.group(1)) for m in re.finditer(rf"{JOB}(?:\s+[A-Za-z]\w*){{1,2}}\s+(\d+)/10\b", output)]


def say(line: str) -> None:
    sys.stderr.write(f"[realpods] {line}\n")


def dashboard_status(url: str, token: str | None) -> int:
    """The HTTP status of a GET on the Ray dashboard's job API (from the host: pod IPs are routed)."""
    request = urllib.request.Request(url, headers={"x-ray-authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:  # not listening yet (URLError is an OSError)
        return 0


def check_ray_token_auth(cluster: Cluster, ns: str, pods: list[dict[str, Any]]) -> None:
    """The head's dashboard and job API refuse a caller without the RayCluster's token (the Secret
    KubeRay made, which KubeRay's own submission used) and answer one with it."""
    (head,) = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "head"]
    cluster_name = head["metadata"]["labels"]["ray.io/cluster"]
    secret = wait_for("KubeRay's auth Secret", lambda: cluster.get("secret", cluster_name, ns), 60)
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    url = f"http://{head['status']['podIP']}:8265/api/jobs/"
    wait_for("the head's dashboard answering", lambda: dashboard_status(url, token) == 200, 120)
    assert dashboard_status(url, None) in (401, 403)
    assert dashboard_status(url, "not-the-token") in (401, 403)


# Connects to each host:port given and prints whether it opened (kube-router rejects what a
# NetworkPolicy denies: ConnectionRefusedError at once).
PROBE = (
    "import socket, sys\n"
    "for target in sys.argv[1:]:\n"
    "    host, port = target.rsplit(':', 1)\n"
    "    s = socket.socket(); s.settimeout(5)\n"
    "    try:\n"
    "        s.connect((host, int(port))); print(target, 'open')\n"
    "    except OSError as exc:\n"
    "        print(target, type(exc).__name__)\n"
    "    s.close()\n"
)


def probe(cluster: Cluster, ns: str, pod_name: str, container: str, *targets: str) -> dict[str, str]:
    out = cluster.kubectl("exec", pod_name, "-n", ns, "-c", container, "--", "python3", "-c", PROBE, *targets)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines())


def check_network_policy(cluster: Cluster, ns: str, pods: list[dict[str, Any]]) -> None:
    """The job's NetworkPolicy, enforced on the real node (kube-router): its worker reaches the head's
    GCS (6379) and dashboard (8265); a pod of the same namespace that is not the job's reaches
    neither, though it reaches the cluster's DNS."""
    (head,) = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "head"]
    worker = next(p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker")
    ports = [f"{head['status']['podIP']}:{port}" for port in (6379, 8265)]
    container = worker["spec"]["containers"][0]["name"]
    from_worker = probe(cluster, ns, worker["metadata"]["name"], container, *ports)
    assert all(v == "open" for v in from_worker.values()), from_worker
    cluster.apply(
        {**pod("outsider", "import time; time.sleep(900)"), "metadata": {"name": "outsider", "namespace": ns}}
    )
    try:
        wait_phase(cluster, ns, "outsider", {"Running"})
        dns = (cluster.get("service", "kube-dns", "kube-system") or {})["spec"]["clusterIP"]

        def shut_out() -> dict[str, str] | None:  # kube-router programs a new pod's rules in seconds
            seen = probe(cluster, ns, "outsider", "main", *ports, f"{dns}:53")
            return seen if all(seen[p] != "open" for p in ports) else None

        from_outside = wait_for("the head's ports closed to a pod outside the job", shut_out, 60)
    finally:
        cluster.kubectl("delete", "pod", "outsider", "-n", ns, "--wait=false", check=False)
    say(f"from the job's worker: {from_worker}; from another pod: {from_outside}")
    assert from_outside.pop(f"{dns}:53") == "open", from_outside
    assert all(v != "open" for v in from_outside.values()), from_outside


def job_story(cluster: Cluster, name: str, ns: str, operator_ns: str) -> str:
    """What the job, its RayJob, its pods, the namespace's events and the two operators' logs say:
    the failure message of a wait that timed out (a rerun costs a quarter of an hour)."""
    status = job_status(cluster, name, ns)
    lines = [
        "job: "
        + json.dumps({k: status.get(k) for k in ("phase", "restarts", "restartHistory", "conditions")}),
    ]
    rayjob = cluster.get("rayjob", name, ns) or {}
    meta = rayjob.get("metadata") or {}
    lines.append(
        "rayjob: "
        + json.dumps(
            {
                "uid": meta.get("uid"),
                "deletionTimestamp": meta.get("deletionTimestamp"),
                "finalizers": meta.get("finalizers"),
                "suspend": (rayjob.get("spec") or {}).get("suspend"),
                "status": rayjob.get("status"),
            }
        )
    )
    for p in cluster.list("pods", ns):
        states = [c.get("state") for c in p["status"].get("containerStatuses") or []]
        lines.append(
            f"pod {p['metadata']['name']}: {p['status'].get('phase')} "
            f"deleting={bool(p['metadata'].get('deletionTimestamp'))} {json.dumps(states)}"
        )
    events = sorted(cluster.list("events", ns), key=lambda e: int(e["metadata"]["resourceVersion"]))
    lines += [
        f"event {e['involvedObject']['name']} {e['reason']}: {e.get('message', '')}" for e in events[-25:]
    ]
    operator = cluster.kubectl("logs", "-n", operator_ns, "deploy/rljob", "--tail=40", check=False)
    lines += ["operator log:", operator.stdout + operator.stderr]
    kuberay = Path(cluster.state.get("logs", "")) / "ray-operator.log"
    if kuberay.is_file():
        lines += ["KubeRay log:", *kuberay.read_text(errors="replace").splitlines()[-30:]]
    return "\n".join(lines)


def job_status(cluster: Cluster, name: str, ns: str) -> dict[str, Any]:
    return (cluster.get("rljob", name, ns) or {}).get("status") or {}


def phase(cluster: Cluster, name: str, ns: str) -> str:
    return str(job_status(cluster, name, ns).get("phase", ""))


def progress_step(cluster: Cluster, name: str, ns: str) -> int:
    return int((job_status(cluster, name, ns).get("progress") or {}).get("step") or 0)


def head_pod(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    heads = [
        p
        for p in cluster.list("pods", ns, "ray.io/node-type=head")
        if not p["metadata"].get("deletionTimestamp")
    ]
    return heads[0] if heads else None


# Run in the head's container: SIGKILL the Ray job's driver (`rljob-runtime train`, started by Ray's
# job supervisor), as the OOM killer or a crash would; prints the pids killed.
KILL_DRIVER = (
    "import os, signal\n"
    "killed = []\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "    except OSError:\n"
    "        continue\n"
    "    if b'train' in argv and any(os.path.basename(a) == b'rljob-runtime' for a in argv):\n"
    "        os.kill(int(pid), signal.SIGKILL)\n"
    "        killed.append(pid)\n"
    "print(' '.join(killed))\n"
)


def reward_writes_per_step(logdir: Path) -> dict[int, int]:
    """How many times each step's training reward was written, over every event file (a resumed run
    writes again the steps after its checkpoint)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    counts: dict[int, int] = {}
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "reward/mean":
                    counts[event.step] = counts.get(event.step, 0) + 1
    return counts


def print_step_times(logdir: Path) -> None:
    """Each step's phases (seconds) and sync size, as the runtime logged them: where the time went."""
    from rljob_demo import curve

    scalars = curve.read_scalars(logdir)
    tags = ["time/step", "time/generate", "time/train", "time/sync", "time/save"]
    say("step  " + "  ".join(f"{t[5:]:>8}" for t in tags) + "  sync MB")
    for step, _ in scalars.get("time/step", []):
        row = [dict(scalars.get(t, [])).get(step) for t in tags]
        size = dict(scalars.get("sync/bytes", [])).get(step, 0.0) / 1e6
        say(
            f"{step:4d}  "
            + "  ".join(f"{v:8.1f}" if v is not None else f"{'-':>8}" for v in row)
            + f"  {size:7.0f}"
        )


def ready_condition(cluster: Cluster, name: str, ns: str) -> dict[str, Any]:
    conditions = job_status(cluster, name, ns).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def stop_kubelet_until_the_job_shows_it(cluster: Cluster, name: str, ns: str) -> None:
    """SIGSTOP the real node's kubelet (its containers run on) until the job's Ready condition names
    the node, then SIGCONT it and wait for the job to read Running again. The node lifecycle
    controller marks the node after its --node-monitor-grace-period (40 s on a cluster with a real
    node: controlplane.real_node_patches) plus up to one --node-monitor-period (5 s)."""
    kubelet = int(cluster.state["real_node"]["kubelet_pid"])
    t0 = time.monotonic()
    os.kill(kubelet, signal.SIGSTOP)
    try:
        shown = wait_for(
            "the job's Ready condition naming the not-Ready node",
            lambda: (c := ready_condition(cluster, name, ns)).get("reason") == "NodeNotReady" and c,
            180,
        )
    finally:
        os.kill(kubelet, signal.SIGCONT)
    say(f"kubelet stopped; {time.monotonic() - t0:.0f} s later the job said: {shown['message']}")
    assert shown["status"] == "False" and f"on node {NODE}, which is not Ready" in shown["message"], shown
    (row,) = cluster.kubectl("get", "rljob", name, "-n", ns, "--no-headers").stdout.splitlines()
    assert row.split()[1:3] == ["Running", "NodeNotReady"], row  # PHASE, REASON
    events = [e for e in cluster.list("events", ns) if e["involvedObject"]["name"] == name]
    assert any(e["reason"] == "NodeNotReady" and e["type"] == "Warning" for e in events), events
    wait_for(
        "the job Running again with the kubelet back",
        lambda: ready_condition(cluster, name, ns).get("reason") in ("Running", "Completed"),
        180,
    )
    say(f"kubelet back; the job Ready again {time.monotonic() - t0:.0f} s after the stop")


def resumed_messages(cluster: Cluster, name: str, ns: str) -> list[str]:
    """The messages of the job's Resumed events (the runtime's, one per run that resumed), oldest first."""
    job = cluster.get("rljob", name, ns)
    if job is None:
        return []
    events = sorted(
        (e for e in cluster.list("events", ns) if of_this_job(e, job) and e["reason"] == "Resumed"),
        key=lambda e: int(e["metadata"]["resourceVersion"]),
    )
    return [e.get("message", "") for e in events]


def of_this_job(event: dict[str, Any], job: dict[str, Any]) -> bool:
    """An event about this job, not an earlier one of its name (some events of the namespace, about
    other objects, carry no uid)."""
    about = event["involvedObject"]
    return about.get("kind") == "RLTrainingJob" and about.get("uid") == job["metadata"]["uid"]


@pytest.fixture
def demo_removed_after(real_cluster: Cluster) -> Iterator[None]:
    """`make demo-down` after the test, also a failed one: the demo's operator release would collide
    with the next modules' (the same chart, cluster-scoped objects)."""
    yield
    Demo(real_cluster, "demo-down", "DEMO_ARGS=--keep-cluster").wait(600)


def test_make_demo_runs_in_real_pods_through_three_faults_learns_and_demo_down_removes_it(
    real_cluster: Cluster, runtime_image: str, demo_removed_after: None
) -> None:
    """`make demo` with three faults on the way:
    - its head pod deleted after a step: the pod's preStop hook has the runtime finish the step in
      flight and save it, and the job goes on from that step on a new head;
    - then its driver SIGKILLed: the job is restarted (the example's backoffLimit) and resumes from
      its last checkpoint;
    - then the node's kubelet stopped: the node goes NotReady and the job says so, then recovers.
    It reaches Succeeded with every step trained once before the drain and its reward rising."""
    from rljob_demo import cli, curve, runs

    ns, name = NAMESPACE, JOB
    runs_dir = cli.CACHE / "demo" / real_cluster.name / "runs"
    before = set(runs.list_runs(runs_dir))

    def story() -> str:
        return f"make demo printed:\n{first.output}\n" + job_story(real_cluster, name, ns, "rljob-system")

    t0 = time.monotonic()
    first = Demo(real_cluster, "demo", "DEMO_ARGS=--poll 1")
    second: Demo | None = None
    try:
        pods = wait_for(
            "the job's Ray head and worker pods Running on the real node",
            lambda: (
                first.running()
                and (ps := real_cluster.list("pods", ns, "ray.io/cluster"))
                and len(ps) >= 2
                and all(p["status"].get("phase") == "Running" for p in ps)
                and ps
            ),
            900,
            story,
        )
        assert {p["spec"]["nodeName"] for p in pods} == {NODE}, [
            (p["metadata"]["name"], p["spec"].get("nodeName")) for p in pods
        ]
        say(f"pods Running {time.monotonic() - t0:.0f} s after make demo started")
        check_ray_token_auth(real_cluster, ns, pods)
        check_network_policy(real_cluster, ns, pods)

        # Fault 1: the head pod deleted after a step; the step in flight is saved (preStop).
        wait_for(
            "a first step reported from the head pod",
            lambda: first.running() and progress_step(real_cluster, name, ns) >= 1,
            900,
            story,
        )
        # A second `make demo` while the job trains: it attaches to it instead of applying again.
        second = Demo(real_cluster, "demo", "DEMO_ARGS=--poll 5")
        first_head = head_pod(real_cluster, ns)
        assert first_head is not None
        deleted_after = progress_step(real_cluster, name, ns)
        real_cluster.kubectl("delete", "pod", first_head["metadata"]["name"], "-n", ns, "--wait=false")
        say(
            f"head pod deleted after step {deleted_after}, {time.monotonic() - t0:.0f} s after make demo started"
        )

        # The runtime on the new head says Resumed once it has loaded the checkpoint, just before its
        # first step there: the driver is killed then, so no step trained on this head is trained
        # again after the kill (a step costs a minute or two on two cores).
        def resumed_on_a_new_head() -> dict[str, Any] | None:
            head = head_pod(real_cluster, ns)
            new = head is not None and head["metadata"]["uid"] != first_head["metadata"]["uid"]
            return head if new and resumed_messages(real_cluster, name, ns) else None

        head = wait_for("the job resumed on a new head pod", resumed_on_a_new_head, 1200, story)
        status = job_status(real_cluster, name, ns)
        say(
            f"{resumed_messages(real_cluster, name, ns)[0]} on a new head: "
            f"{json.dumps(status.get('restartHistory'))}"
        )
        # The drained runtime exits EXIT_PREEMPTED before its head container goes. Either KubeRay saw
        # the head go first and submitted the Ray job again to the new head (the operator sees
        # nothing), or it read the Ray job's exit first and failed the RayJob, and the operator
        # restarted the job for a preemption (not counted against backoffLimit). Which comes first
        # is a race.
        drain_restarts = status.get("preemptions") or 0
        assert status.get("restarts", 0) == drain_restarts <= 1, status

        # Fault 2: the driver SIGKILLed.
        container = head["spec"]["containers"][0]["name"]
        killed = real_cluster.kubectl(
            "exec", head["metadata"]["name"], "-n", ns, "-c", container, "--", "python3", "-c", KILL_DRIVER
        ).stdout.split()
        assert killed, "no rljob-runtime train process in the new head pod"
        say(f"driver {killed} killed after step {progress_step(real_cluster, name, ns)}")

        # Fault 3: the node's kubelet stopped (SIGSTOP) as soon as the restarted job runs again, so its
        # remaining steps (minutes) outlast the node controller's grace period: the node goes NotReady,
        # and the job says which pod and node; with the kubelet back, Running again.
        def restarted_and_running() -> bool:
            status = job_status(real_cluster, name, ns)
            return status.get("restarts") == drain_restarts + 1 and status.get("phase") == "Running"

        wait_for("the restarted job Running", restarted_and_running, 900, story)
        stop_kubelet_until_the_job_shows_it(real_cluster, name, ns)

        rc = first.wait(TIMEOUT_S)
        assert rc == 0, story()
        assert second.wait(300) == 0, second.output
    finally:
        for demo in (first, second):
            if demo is not None:
                demo.stop()
    out = first.output
    say(f"make demo ended {time.monotonic() - t0:.0f} s after it started; its last lines:")
    for line in first.lines[-8:]:
        say(f"  {line}")
    assert "✓ Succeeded in" in out, out
    assert "already running" in second.output and "✓ Succeeded" in second.output, second.output
    steps = step_column(out)  # progress advanced in the live view
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps

    final = real_cluster.get("rljob", name, ns)
    assert final is not None
    status = final["status"]
    say(f"{status['phase']}: {json.dumps(status.get('restartHistory'))}")
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["progress"]["stepText"] == f"{STEPS}/{STEPS}", status
    # The head pod's loss: a resubmission by KubeRay or a preemption restart (above); the runtime
    # says it resumed either way. The driver's kill: one restart by the operator, counted.
    assert status.get("restarts") == drain_restarts + 1, status
    assert (status.get("preemptions") or 0) == drain_restarts, status
    reasons = [e["reason"] for e in status["restartHistory"]]
    assert reasons == ["Preempted"] * drain_restarts + ["DriverKilled"], status["restartHistory"]
    events = sorted(
        (e for e in real_cluster.list("events", ns) if of_this_job(e, final)),
        key=lambda e: int(e["metadata"]["resourceVersion"]),
    )
    resumed = resumed_messages(real_cluster, name, ns)
    say(f"Resumed events: {resumed}")
    assert len(resumed) == 2, resumed
    # The first resume is the drained head's: from the step in flight at the deletion (or the one
    # before, had none been in flight), so nothing reported before the deletion is lost.
    drained_at = int(resumed[0].split()[3])
    assert drained_at >= deleted_after, (deleted_after, resumed)
    transitions = [e["message"].split(":")[0] for e in events if " -> " in e["message"]]
    assert transitions[:3] == ["New -> Pending", "Pending -> Starting", "Starting -> Running"], transitions
    assert transitions[-1].endswith("-> Succeeded"), transitions

    # The progress was written by the runtime itself (its field manager on the status subresource),
    # from the head pod: this cluster's KubeRay reaches only real heads, so no driver ran elsewhere.
    shown = real_cluster.kubectl("get", "rljob", name, "-n", ns, "-o", "json", "--show-managed-fields")
    fields = json.loads(shown.stdout)["metadata"].get("managedFields", [])
    managers = {(m.get("manager"), m.get("subresource")) for m in fields}
    assert any(mgr and "runtime" in mgr and sub == "status" for mgr, sub in managers), managers
    rayjob = real_cluster.get("rayjob", name, ns) or {}
    assert rayjob.get("spec", {}).get("submissionMode", "HTTPMode") == "HTTPMode", rayjob.get("spec")
    assert rayjob.get("status", {}).get("jobStatus") == "SUCCEEDED", rayjob.get("status")

    # The run's directory on this machine (the runs volume): the last checkpoint, the TensorBoard
    # logs, the reward curve. Every step was trained, the steps up to the drain once (the drain saved
    # the step in flight); the reward rose; the baseline evaluation and two more.
    (run_dir,) = set(runs.list_runs(runs_dir)) - before
    assert run_dir.name in out and "reward.png" in out and "tensorboard --logdir" in out, out
    ckpt = run_dir / "checkpoints"
    assert (ckpt / f"iter_{STEPS:07d}" / "complete").exists(), sorted(p.name for p in ckpt.iterdir())
    assert (ckpt / f"iter_{STEPS:07d}" / "model" / "config.json").exists()
    assert str(ckpt / f"iter_{STEPS:07d}") in out.replace("~", str(Path.home())), out
    tb = ckpt / "tensorboard"
    print_step_times(tb)
    writes = reward_writes_per_step(tb)
    say(f"reward writes per step: {writes}")
    assert sorted(writes) == list(range(1, STEPS + 1)), writes
    assert all(writes[step] == 1 for step in range(1, drained_at + 1)), (drained_at, writes)
    scalars = curve.read_scalars(tb)
    rewards = [v for _, v in scalars["reward/mean"]]
    ok, why = learned(rewards)
    say(why)
    assert ok, why
    assert (run_dir / "reward.png").read_bytes()[:4] == b"\x89PNG"
    evals = sorted({step for step, _ in scalars["eval/add-1digit/reward"]})
    assert evals[0] == 0 and evals[-1] == STEPS, evals
    assert "eval add-1digit" in out and "(before training) ->" in out, out

    # make demo-down: the job, its volumes and the operator go; the run's files stay (no --purge).
    down = Demo(real_cluster, "demo-down", "DEMO_ARGS=--keep-cluster")
    assert down.wait(600) == 0, down.output
    assert (
        real_cluster.get("namespace", ns) is None
        or real_cluster.get("namespace", ns)["status"]["phase"] == "Terminating"
    )
    assert not real_cluster.kubectl(
        "get", "pv", "-l", "app.kubernetes.io/part-of=rljob-demo", "-o", "name"
    ).stdout.strip()
    assert not real_cluster.kubectl(
        "get", "deploy", "-A", "-l", "app.kubernetes.io/instance=rljob", "-o", "name"
    ).stdout.strip()
    assert "uninstalled" in down.output and run_dir.is_dir(), down.output
