"""`make demo` exactly as a user runs it, on a control plane of its own: it starts the cluster,
the operator and the CPU GRPO job, watches it learn to Succeeded; a second `make demo` meanwhile
attaches instead of applying again; `make demo-down` removes everything.

This is also CI's learning proof (the only test that trains the demo config): the mean reward of its
ten steps must rise by the criterion in tests/learning.py, so the test fails when learning breaks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from learning import learned

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "rljob-demo-e2e"
NAMESPACE = "rljob-demo"
TTL = 5
# About 10 min alone on 2 cores (the e2e tier runs it first); three times longer on a loaded machine.
TIMEOUT_S = 2700


class Demo:
    """`make demo` (or another target) as a subprocess whose output is collected line by line."""

    def __init__(self, target: str, *extra: str) -> None:
        env = {**os.environ, "RLJOB_CLUSTER": CLUSTER}
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

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def devcluster_state() -> dict[str, Any] | None:
    proc = subprocess.run(
        [sys.executable, "tools/devcluster/devcluster.py", "status", "--json", f"--name={CLUSTER}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(proc.stdout)["state"] if proc.returncode == 0 else None


def kubectl(state: dict[str, Any], *args: str) -> Any:
    proc = subprocess.run(
        [state["kubectl"], *args, "-o", "json"],
        env={**os.environ, "KUBECONFIG": state["kubeconfig"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


def wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}", pytrace=False)


def step_column(output: str) -> list[int]:
    """The STEP values of the live view's rows (`1:05   grpo-cpu-demo   Running   Running   3/10   0.41 ...`).

    PHASE, then REASON (empty while the job has no Ready condition), then STEP.
    """
    return [
        int(m.group(1)) for m in re.finditer(r"grpo-cpu-demo(?:\s+[A-Za-z]\w*){1,2}\s+(\d+)/10\b", output)
    ]


def test_make_demo_learns_to_succeeded_and_demo_down_removes_it() -> None:
    from rljob_demo import cli, runs

    # Earlier runs: a new run removes all but the newest one (the default --keep-runs 2).
    runs_dir = cli.CACHE / "demo" / CLUSTER / "runs"
    stale = [runs_dir / f"20000101-00000{i}" for i in range(3)]
    for run in stale:
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    first = Demo("demo", f"DEMO_ARGS=--ttl {TTL} --poll 1")
    second: Demo | None = None
    try:
        # A second `make demo` once the first one's job trains: it must attach, not apply again.
        deadline = time.monotonic() + TIMEOUT_S
        while second is None and first.proc.poll() is None and time.monotonic() < deadline:
            if step_column(first.output):
                second = Demo("demo", "DEMO_ARGS=--poll 2")
            time.sleep(1)
        rc = first.wait(TIMEOUT_S)
        assert rc == 0, first.output
        assert second is not None, f"never saw a training step:\n{first.output}"
        assert second.wait(300) == 0, second.output
        assert "already running" in second.output and "✓ Succeeded" in second.output, second.output

        out = first.output
        assert "✓ Succeeded in" in out, out
        state = devcluster_state()
        assert state is not None, "the demo's cluster should still run after make demo"
        job = kubectl(state, "get", "rljob", "grpo-cpu-demo", "-n", NAMESPACE)
        uid = job["metadata"]["uid"]

        # phase sequence, from the job's events (every transition is one event)
        events = kubectl(state, "get", "events", "-n", NAMESPACE)["items"]
        transitions = [
            e["message"].split(":")[0]
            for e in sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))
            if e["involvedObject"]["uid"] == uid and " -> " in e["message"]
        ]
        assert transitions == [
            "New -> Pending",
            "Pending -> Starting",
            "Starting -> Running",
            "Running -> Succeeded",
        ]

        # progress advanced in the live view; the final status holds the last step
        steps = step_column(out)
        assert len(set(steps)) >= 3 and steps == sorted(steps), steps
        assert job["status"]["progress"]["stepText"] == "10/10"

        # the reward rose (TensorBoard logs written by the runtime, the same numbers as the PNG)
        from rljob_demo import curve

        run_dir = Path(job["spec"]["checkpoint"]["path"]).parent
        kept = runs.list_runs(runs_dir)
        assert len(kept) == 2 and kept[-1] == run_dir and not any(run.exists() for run in stale[:2]), kept
        assert "earlier run(s)" in out, out
        rewards = [v for _, v in curve.read_scalars(run_dir / "checkpoints" / "tensorboard")["reward/mean"]]
        assert len(rewards) == 10, rewards  # one per step of this run
        ok, why = learned(rewards)
        assert ok, why
        assert (run_dir / "reward.png").read_bytes()[:4] == b"\x89PNG"
        # data.eval.beforeTraining: the eval line starts from the baseline, so it shows what training did
        evals = curve.read_scalars(run_dir / "checkpoints" / "tensorboard")["eval/add-1digit/reward"]
        assert [step for step, _ in evals] == [0, 5, 10], evals
        assert "eval add-1digit" in out and "(before training) ->" in out, out
        assert str(run_dir.name) in out and "reward.png" in out and "tensorboard --logdir" in out

        # checkpoints and the Ray job's outcome
        assert (run_dir / "checkpoints" / "iter_0000010" / "complete").exists()
        assert (run_dir / "checkpoints" / "iter_0000010" / "model" / "config.json").exists()
        assert not (run_dir / "checkpoints" / "iter_0000005").exists()  # maxToKeep: 1
        rayjob = kubectl(state, "get", "rayjob", "grpo-cpu-demo", "-n", NAMESPACE)
        assert rayjob["status"]["jobStatus"] == "SUCCEEDED"

        # ttlSecondsAfterFinished: the Ray cluster and its pods go; the job and its status stay
        wait(
            "the Ray cluster removed after the TTL",
            lambda: (
                not kubectl(state, "get", "rayclusters", "-n", NAMESPACE)["items"]
                and not kubectl(state, "get", "pods", "-n", NAMESPACE)["items"]
            ),
            TTL + 90,
        )
        job = kubectl(state, "get", "rljob", "grpo-cpu-demo", "-n", NAMESPACE)
        assert job["status"]["phase"] == "Succeeded" and job["status"]["progress"]["stepText"] == "10/10"
    finally:
        for demo in (first, second):
            if demo is not None and demo.proc.poll() is None:
                demo.proc.kill()
        down = Demo("demo-down", "DEMO_ARGS=--purge")
        rc = down.wait(600)
    assert rc == 0, down.output
    assert runs.list_runs(runs_dir) == [] and "run outputs" in down.output, down.output
    assert devcluster_state() is None, "make demo-down should stop the demo's cluster"
    assert "operator" in down.output and "stopped" in down.output
