"""Fixtures for e2e tests against the local control plane (tools/devcluster/devcluster.py).

The session fixture ``cluster`` reuses a healthy running dev cluster, or starts one (building the
binaries on first use) and stops it at the end of the session unless ``RLJOB_KEEP_CLUSTER=1``.
When the harness cannot start, every test using it fails with the harness's message: e2e tests
are never skipped silently, so CI notices.

`make test-e2e` runs the tests on two pytest-xdist workers, each module whole on one of them
(``--dist loadfile``: a module's operator fixture serves its tests), each worker with a control plane
of its own (``cluster_name``). The devcluster's machine-wide lock keeps the two starts from taking
the same ports. `make demo`'s own test runs in the real-pod tier (tests/realpods).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e.kube_http import KubeHTTP

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "tools" / "devcluster" / "devcluster.py"
# A cold build of the Go binaries takes many minutes on a small machine.
UP_TIMEOUT_S = float(os.environ.get("RLJOB_CLUSTER_UP_TIMEOUT", "3600"))


@dataclass(frozen=True)
class Cluster:
    """A running dev cluster: a real API server, kwok nodes, KubeRay and a local Ray head."""

    name: str
    kubeconfig: Path
    kubectl_bin: Path
    apiserver: str
    ray_dashboard: str
    started_here: bool
    state: dict[str, Any] = field(repr=False)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster; with check=True a failure fails the test with stderr."""
        cmd = [str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, env=self.env()
        )
        if check and proc.returncode != 0:
            pytest.fail(
                f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}",
                pytrace=False,
            )
        return proc

    def apply(self, *objs: dict[str, Any]) -> None:
        """Each object applied server-side, in order, over HTTP (`kubectl apply` spent about 1 s of
        the two cores per call on discovery and the OpenAPI schema); a refusal fails the test with
        the API server's message."""
        for obj in objs:
            try:
                self.http.apply(obj)
            except (LookupError, RuntimeError, OSError) as exc:
                pytest.fail(f"apply {exc}", pytrace=False)

    @functools.cached_property
    def http(self) -> KubeHTTP:
        return KubeHTTP(str(self.kubeconfig))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """What `kubectl get KIND NAME -o json` prints, or None when it does not exist; over HTTP (a
        kubectl process per poll cost more CPU than the operators under test)."""
        try:
            return self.http.get(kind, name, namespace or "default")
        except (LookupError, RuntimeError, OSError) as exc:
            pytest.fail(f"get {kind} {name}: {exc}", pytrace=False)

    def list(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """The items of `kubectl get KIND --namespace=NS [--selector=S] -o json`, over HTTP."""
        try:
            return self.http.list(kind, namespace, selector)
        except (LookupError, RuntimeError, OSError) as exc:
            pytest.fail(f"list {kind} in {namespace}: {exc}", pytrace=False)

    def logs_hint(self) -> str:
        return f"logs: {self.state.get('logs')} and {self.state.get('kwok', {}).get('logs')}"


def _devcluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEVCLUSTER), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def _status(name: str) -> tuple[bool, dict[str, Any]]:
    proc = _devcluster("status", "--json", f"--name={name}", timeout=120)
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        return False, {"error": proc.stdout + proc.stderr}
    return proc.returncode == 0 and bool(info.get("ok")), info


def cluster_name() -> str:
    """RLJOB_CLUSTER (default rljob-dev); on a pytest-xdist worker its id appended: each worker has
    a control plane of its own (two operators on one API server would reconcile each other's jobs)."""
    name = os.environ.get("RLJOB_CLUSTER", "rljob-dev")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{name}-{worker}" if worker else name


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    name = cluster_name()
    ok, info = _status(name)
    started = False
    if not ok:
        t0 = time.monotonic()
        try:
            up = _devcluster("up", f"--name={name}", "--recreate", timeout=UP_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"devcluster up did not finish in {UP_TIMEOUT_S:.0f} s: {exc}", pytrace=False)
        if up.returncode != 0:
            pytest.fail(
                f"the e2e harness could not start (devcluster up exited {up.returncode}):\n"
                f"{up.stderr}\n--- stdout ---\n{up.stdout}",
                pytrace=False,
            )
        sys.stderr.write(f"\n[e2e] started dev cluster {name} in {time.monotonic() - t0:.0f} s\n")
        started = True
        ok, info = _status(name)
        if not ok:
            pytest.fail(
                f"dev cluster {name} started but is not healthy: {json.dumps(info, indent=2)}", pytrace=False
            )
    state = info["state"]
    c = Cluster(
        name=name,
        kubeconfig=Path(state["kubeconfig"]),
        kubectl_bin=Path(state["kubectl"]),
        apiserver=state["apiserver"],
        ray_dashboard=state["ray"]["dashboard"],
        started_here=started,
        state=state,
    )
    try:
        yield c
    finally:
        if started and os.environ.get("RLJOB_KEEP_CLUSTER") != "1":
            down = _devcluster("down", f"--name={name}", timeout=600)
            if down.returncode != 0:
                sys.stderr.write(f"[e2e] devcluster down failed:\n{down.stdout}{down.stderr}\n")


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for it to go away)."""
    ns = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> Cluster:
    """The RLTrainingJob CRD installed (or updated) server-side, as the docs tell users to."""
    from rljob_api.resource import CRD_NAME

    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    # Polled: `kubectl wait --for=condition=Established` fails outright on a CRD whose status is
    # not written yet. Discovery and the published OpenAPI (kubectl explain) lag Established a little.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    probes: list[tuple[tuple[str, ...], Callable[[subprocess.CompletedProcess[str]], bool]]] = [
        (("get", f"crd/{CRD_NAME}", "-o", f"jsonpath={established}"), lambda p: p.stdout.strip() == "True"),
        (("get", "rljobs", "-A"), lambda p: p.returncode == 0),
        (("explain", "rltrainingjob.spec"), lambda p: p.returncode == 0),
    ]
    deadline = time.monotonic() + 60
    for probe, ok in probes:
        while not ok(cluster.kubectl(*probe, check=False)):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"kubectl {' '.join(probe)} still fails 60 s after the CRD was applied", pytrace=False
                )
            time.sleep(0.5)
    return cluster
