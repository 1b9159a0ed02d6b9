"""Fixtures of the real-pod tier: the built images, and a dev cluster with a real node.

The cluster (`devcluster.py up --real-node`) is `make demo`'s, rljob-demo: a machine runs one real
node, and the tier runs `make demo` itself. Beside the e2e suite's, it runs the kwok GPU pools for
scheduling and one real node (kubelet, containerd, kube-proxy, CoreDNS, kube-router) where CPU pods
really run. A demo's cluster left running is reused, without its job and operator release (they
would collide with the tests'); started once per session and stopped at its end unless
RLJOB_KEEP_CLUSTER=1. If it cannot start, every test that needs it fails with the harness's message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from chart_render import helm_binary
from e2e.chart_install import helm
from e2e.conftest import Cluster
from real_pods import RELEASE

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "tools" / "devcluster" / "devcluster.py"
IMAGEBUILD = REPO / "tools" / "imagebuild" / "imagebuild.py"
NAME = os.environ.get("RLJOB_REAL_CLUSTER", "rljob-demo")  # rljob_demo.cli.DEFAULT_CLUSTER
UP_TIMEOUT_S = float(os.environ.get("RLJOB_CLUSTER_UP_TIMEOUT", "3600"))


def run(*cmd: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=REPO)


def load_into_node(archive: Path, timeout: float) -> None:
    """An OCI archive imported into the real node's containerd (`devcluster.py load-images`)."""
    load = run(
        sys.executable, str(DEVCLUSTER), "load-images", f"--name={NAME}", str(archive), timeout=timeout
    )
    if load.returncode != 0:
        pytest.fail(
            f"devcluster load-images exited {load.returncode}:\n{load.stderr}{load.stdout}", pytrace=False
        )


@pytest.fixture(scope="session")
def image_archives() -> dict[str, Path]:
    """The operator and runtime-cpu OCI archives (built by `make images`; built here if missing)."""
    archives = {}
    for name in ("operator", "runtime-cpu"):
        proc = run(sys.executable, str(IMAGEBUILD), "path", name, timeout=3600)
        if proc.returncode != 0:
            pytest.fail(f"image {name} could not be built:\n{proc.stderr}{proc.stdout}", pytrace=False)
        archives[name] = Path(proc.stdout.strip().splitlines()[-1])
    return archives


@pytest.fixture(scope="session")
def real_cluster(image_archives: dict[str, Path]) -> Iterator[Cluster]:
    t0 = time.monotonic()
    up = run(
        sys.executable,
        str(DEVCLUSTER),
        "up",
        f"--name={NAME}",
        "--real-node",
        "--install-deps",  # containerd, runc, conntrack from Debian's packages when missing (root)
        "--recreate",
        timeout=UP_TIMEOUT_S,
    )
    if up.returncode != 0:
        pytest.fail(
            f"devcluster up --real-node exited {up.returncode}:\n{up.stderr}\n{up.stdout}", pytrace=False
        )
    # A `make demo` left running: its job and operator release go (its cluster stays).
    demo_down = subprocess.run(
        [sys.executable, "-m", "rljob_demo", "down", "--keep-cluster", f"--cluster={NAME}"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "tools")},
    )  # fmt: skip
    if demo_down.returncode != 0:
        pytest.fail(f"make demo-down failed:\n{demo_down.stdout}{demo_down.stderr}", pytrace=False)
    # Most pods of these tests run the operator image; the runtime's is loaded by runtime_image.
    load_into_node(image_archives["operator"], timeout=900)
    status = run(sys.executable, str(DEVCLUSTER), "status", "--json", f"--name={NAME}", timeout=120)
    state = json.loads(status.stdout)["state"]
    sys.stderr.write(f"\n[realpods] cluster {NAME} with a real node up in {time.monotonic() - t0:.0f} s\n")
    cluster = Cluster(
        name=NAME,
        kubeconfig=Path(state["kubeconfig"]),
        kubectl_bin=Path(state["kubectl"]),
        apiserver=state["apiserver"],
        ray_dashboard=state["ray"]["dashboard"],
        started_here=True,
        state=state,
    )
    try:
        yield cluster
    finally:
        if os.environ.get("RLJOB_KEEP_CLUSTER") != "1":
            down = run(sys.executable, str(DEVCLUSTER), "down", f"--name={NAME}", timeout=600)
            if down.returncode != 0:
                sys.stderr.write(f"[realpods] devcluster down failed:\n{down.stdout}{down.stderr}\n")


@pytest.fixture(scope="session")
def runtime_image(real_cluster: Cluster, image_archives: dict[str, Path]) -> str:
    """The runtime-cpu image in the node's containerd (6.5 GB unpacked: minutes the first time; an
    unchanged image is not imported again, and a changed one unpacks only its changed layers)."""
    t0 = time.monotonic()
    load_into_node(image_archives["runtime-cpu"], timeout=1800)
    sys.stderr.write(f"\n[realpods] runtime-cpu in the node's containerd in {time.monotonic() - t0:.0f} s\n")
    return "docker.io/rljob/runtime-cpu:0.1.0"


@pytest.fixture(scope="session")
def node_volumes_dir(real_cluster: Cluster) -> Path:
    """Where the tests' local PersistentVolumes live on the node (the node is this machine)."""
    path = Path(real_cluster.state["real_node"]["dir"]) / "volumes"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def job_namespace(restricted_namespace: str, operator_release: str, real_cluster: Cluster) -> Iterator[str]:
    """A `restricted` namespace for jobs of the operator installed by operator_release; its jobs are
    deleted before the namespace goes."""
    yield restricted_namespace
    real_cluster.kubectl("delete", "rljobs", "--all", "-n", restricted_namespace, "--wait=false", check=False)


@pytest.fixture
def restricted_namespace(real_cluster: Cluster) -> Iterator[str]:
    """A fresh namespace that enforces the `restricted` Pod Security Standard."""
    ns = f"real-{uuid.uuid4().hex[:8]}"
    real_cluster.kubectl("create", "namespace", ns)
    real_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    try:
        yield ns
    finally:
        real_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator_release(real_cluster: Cluster) -> Iterator[str]:
    """The chart installed by helm in a `restricted` namespace, with the image `make images` built
    (already in the node's containerd: pull policy Never); uninstalled afterwards."""
    ns = f"rljob-system-{uuid.uuid4().hex[:6]}"
    real_cluster.kubectl("create", "namespace", ns)
    real_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    try:
        helm(
            real_cluster,
            "install",
            RELEASE,
            str(REPO / "charts" / "rljob"),
            "--namespace",
            ns,
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "operator.resyncSeconds=10",
            "--wait",
            "--timeout=4m",
            timeout=300,
        )
        yield ns
    finally:
        # Also after a failed install: its cluster-scoped objects would block the next one.
        subprocess.run(
            [str(helm_binary()), f"--kubeconfig={real_cluster.kubeconfig}", "uninstall", RELEASE, "-n", ns],
            capture_output=True,
            timeout=120,
            check=False,
        )
        real_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
