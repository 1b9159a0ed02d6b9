"""Two operator replicas with leader election on the real API server: the leader is SIGKILLed in the
middle of a burst of new jobs, the other replica takes the Lease within 15 s and finishes the burst,
and no job ends up with two children or with a phase change announced twice or not at all.

The replicas are rljob-operator processes run as the chart runs them (--leader-elect, a Lease in the
namespace they serve), killable like a pod whose node died."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_process import OperatorProcess, wait_for
from test_operator import _in, job

pytestmark = pytest.mark.e2e

JOBS = 40
LEASE = "rljob-leader"
TAKEOVER_S = 15.0
_CHANGE = re.compile(r"^(\w+) -> (\w+): ")


class Replicas:
    def __init__(self, crd: Any, namespace: str, log_dir: Path) -> None:
        self.crd, self.namespace = crd, namespace
        args = (
            f"--namespace={namespace}",
            "--leader-elect",
            f"--leader-election-namespace={namespace}",
            f"--leader-election-name={LEASE}",
        )
        self.a = OperatorProcess(crd.kubeconfig, log_dir / "a", args=args)
        self.b = OperatorProcess(crd.kubeconfig, log_dir / "b", args=args)
        for replica in (self.a, self.b):
            replica.log_dir.mkdir()

    def holder(self) -> str:
        lease = self.crd.get("lease", LEASE, self.namespace) or {}
        return (lease.get("spec") or {}).get("holderIdentity") or ""

    def stop(self) -> None:
        for replica in (self.a, self.b):
            replica.stop()


def leading(replica: OperatorProcess) -> bool:
    return "rljob_operator_leader 1.0" in replica.metrics()


@pytest.fixture
def replicas(crd: Any, namespace: str, tmp_path: Path) -> Iterator[Replicas]:
    r = Replicas(crd, namespace, tmp_path)
    yield r
    r.stop()


def _operator_events(crd: Any, namespace: str) -> list[dict[str, Any]]:
    events = json.loads(crd.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    mine = [
        e
        for e in events
        if e["involvedObject"].get("kind") == "RLTrainingJob"
        and (e.get("source") or {}).get("component") == "rljob-operator"
    ]
    return sorted(mine, key=lambda e: e.get("eventTime") or e.get("firstTimestamp") or "")


def _chain_problems(name: str, phase: str, changes: list[tuple[str, str]]) -> list[str]:
    """What is wrong with a job's announced phase changes: each starts where the previous one ended
    (none lost), none repeats (none announced twice), and the last ends at the job's phase."""
    problems = []
    expected_from = "New"
    for before, after in changes:
        if before != expected_from:
            problems.append(f"{name}: '{before} -> {after}' follows a change to {expected_from}")
        expected_from = after
    if expected_from != phase:
        problems.append(f"{name}: last announced {expected_from}, but its phase is {phase}")
    if len(set(changes)) != len(changes):
        problems.append(f"{name}: a change announced twice: {changes}")
    return problems


def test_a_replica_takes_over_a_killed_leader_mid_burst_without_double_work_or_lost_transitions(
    crd: Any, namespace: str, replicas: Replicas
) -> None:
    a, b = replicas.a, replicas.b
    a.start()
    wait_for("replica a to lead", lambda: leading(a), a, timeout=60)
    held_by_a = replicas.holder()
    b.start()  # answers its liveness probe while it waits
    assert not leading(b) and replicas.holder() == held_by_a, b.log_tail()

    # 40 GPU jobs of 8 GPUs on 32 fake H100 GPUs: four run, the others stay Starting (pods pending).
    # Applied in the background: the leader is killed once it has made a few RayJobs.
    names = [f"burst-{i:02d}" for i in range(JOBS)]
    burst = json.dumps({"apiVersion": "v1", "kind": "List", "items": [_in(namespace, job(n)) for n in names]})
    applying = subprocess.Popen(
        [str(crd.kubectl_bin), f"--kubeconfig={crd.kubeconfig}", "apply", "-f", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert applying.stdin is not None
    applying.stdin.write(burst)
    applying.stdin.close()
    deadline = time.monotonic() + 120
    while len(crd.list("rayjobs", namespace)) < 3:
        assert time.monotonic() < deadline, a.log_tail()
        time.sleep(0.1)
    a.kill()
    killed, killed_at = time.monotonic(), time.time()
    rayjobs_at_kill = len(crd.list("rayjobs", namespace))
    assert applying.wait(timeout=120) == 0, applying.stdout.read() if applying.stdout else ""

    def taken() -> bool:
        return replicas.holder() not in ("", held_by_a)

    wait_for("replica b to take the lease", taken, b, timeout=60)
    # When b took it, by its own log (this test's polling of the Lease adds its own delay).
    took = _logged_at(b.log_path.read_text(), "leading: took the lease") - killed_at
    assert took <= TAKEOVER_S, f"replica b took the lease {took:.1f} s after the leader was killed"
    wait_for("replica b to run the operator", lambda: leading(b), b, timeout=30)

    def settled() -> dict[str, str] | None:
        objs = crd.list("rljobs", namespace)
        phases = {o["metadata"]["name"]: (o.get("status") or {}).get("phase", "") for o in objs}
        done = len(phases) == JOBS and all(p in ("Starting", "Running") for p in phases.values())
        return phases if done else None

    phases = wait_for("every job Starting or Running", settled, b, timeout=300)
    assert sum(p == "Running" for p in phases.values()) <= 4  # the GPUs there are
    time.sleep(3)  # the last events posted after the last status writes
    caught_up = b.log_path.read_text().count("announced a phase change its previous operator did not")
    print(
        f"\ntakeover {took:.1f} s after the kill; {rayjobs_at_kill}/{JOBS} RayJobs existed at the kill; "
        f"{caught_up} unannounced phase changes caught up by the new leader"
    )

    # One child per job: one RayJob, owned by it, and one Ray cluster of that RayJob at most.
    jobs = {o["metadata"]["name"]: o for o in crd.list("rljobs", namespace)}
    rayjobs = crd.list("rayjobs", namespace)
    owners = [r["metadata"]["ownerReferences"][0]["uid"] for r in rayjobs]
    assert sorted(r["metadata"]["name"] for r in rayjobs) == names
    assert sorted(owners) == sorted(o["metadata"]["uid"] for o in jobs.values())
    clusters = [
        c["metadata"]["labels"].get("ray.io/originated-from-cr-name")
        for c in crd.list("rayclusters", namespace)
    ]
    assert len(clusters) == len(set(clusters)) <= JOBS, clusters

    # Every phase change announced exactly once, in order, ending at the job's phase. The jobs go on
    # moving (a Starting job turns Running when its pods run), so the jobs and their events are read
    # together until they agree; a lost or doubled announcement never heals and fails the wait.
    def announcements() -> tuple[list[dict[str, Any]], dict[str, list[tuple[str, str]]], dict[str, int]]:
        events = _operator_events(crd, namespace)
        changes: dict[str, list[tuple[str, str]]] = {name: [] for name in names}
        created: dict[str, int] = dict.fromkeys(names, 0)
        for e in events:
            name = e["involvedObject"]["name"]
            if e["involvedObject"].get("uid") != jobs[name]["metadata"]["uid"]:
                continue
            if (found := _CHANGE.match(e.get("message", ""))) is not None:
                changes[name].append((found.group(1), found.group(2)))
            elif e.get("reason") == "Created" and e["message"].startswith("created RayJob"):
                created[name] += 1
        return events, changes, created

    problems: list[str] = []

    def agreeing() -> tuple[list[dict[str, Any]], dict[str, int]] | None:
        nonlocal problems
        events, changes, created = announcements()
        now = {
            o["metadata"]["name"]: (o.get("status") or {}).get("phase", "")
            for o in crd.list("rljobs", namespace)
        }
        problems = [p for name in names for p in _chain_problems(name, now[name], changes[name])]
        return None if problems else (events, created)

    deadline = time.monotonic() + 30
    while (agreed := agreeing()) is None and time.monotonic() < deadline:
        time.sleep(1)
    assert agreed is not None, "\n".join(problems) + f"\nlog of b:\n{b.log_tail()}"
    events, created = agreed
    assert all(count <= 1 for count in created.values()), created
    # The burst went on after the kill: the new leader announced some of the changes.
    after_takeover = [
        e for e in events if _CHANGE.match(e.get("message", "")) and e.get("eventTime", "") >= _iso(killed)
    ]
    assert after_takeover, "every change was announced before the kill: the kill was not mid-burst"
    log = b.log_path.read_text()
    assert "leading: took the lease" in log and "lost the leader lease" not in log


def _logged_at(log: str, words: str) -> float:
    """The unix time of the first log line with `words` (the operator logs local time, milliseconds)."""
    line = next(line for line in log.splitlines() if words in line)
    stamp = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
    return time.mktime(stamp) + int(line[20:23]) / 1000


def _iso(monotonic_moment: float) -> str:
    """The wall-clock time (as events carry it) of a monotonic moment of this process."""
    wall = time.time() - (time.monotonic() - monotonic_moment)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1e6):06d}Z"


@pytest.mark.parametrize(
    ("changes", "phase", "wrong"),
    [
        ([("New", "Pending"), ("Pending", "Starting")], "Starting", 0),
        ([("New", "Pending")], "Starting", 1),  # lost: Pending -> Starting
        ([("New", "Pending"), ("Starting", "Running")], "Running", 1),  # a gap in the middle
        ([("New", "Pending"), ("Pending", "Starting"), ("Pending", "Starting")], "Starting", 2),  # twice
    ],
)
def test_the_chain_check_finds_lost_and_repeated_announcements(
    changes: list[tuple[str, str]], phase: str, wrong: int
) -> None:
    assert len(_chain_problems("j", phase, changes)) == wrong
