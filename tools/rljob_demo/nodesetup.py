"""`make demo`'s setup around its real node: the images, the operator installed by its Helm chart, and
the data and runs volumes on this machine. Each step is idempotent and cheap when done already."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from . import inpods
from .kube import Kubectl

REPO = Path(__file__).resolve().parents[2]
IMAGEBUILD = REPO / "tools" / "imagebuild" / "imagebuild.py"
DEVCLUSTER = REPO / "tools" / "devcluster" / "devcluster.py"
CHART = REPO / "charts" / "rljob"
IMAGES = ("operator", "runtime-cpu")
RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


class SetupError(RuntimeError):
    """A setup step failed; the message says which and where its log is."""


def _logged(cmd: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs `cmd` with its output appended to `log` (followable while it runs) and also returned."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        out.write(proc.stdout + proc.stderr)
    return proc


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


def image_archives(log: Path) -> dict[str, Path]:
    """The operator and runtime-cpu OCI archives, built daemonless when their inputs changed
    (tools/imagebuild: minutes the first time, cached after)."""
    proc = _logged([sys.executable, str(IMAGEBUILD), "--install-tools", "path", *IMAGES], log, timeout=3600)
    paths = [Path(line) for line in proc.stdout.splitlines() if line.endswith(".oci.tar")]
    if proc.returncode != 0 or len(paths) != len(IMAGES):
        raise SetupError(f"the images did not build (log: {log}):\n{_tail(proc)}")
    return dict(zip(IMAGES, paths, strict=True))


def cluster_up(cluster: str, log: Path) -> None:
    """The local control plane with a real node (a kubelet, containerd and runc of this machine);
    a running one is reused, one without a real node is recreated with it."""
    cmd = [
        sys.executable,
        str(DEVCLUSTER),
        "up",
        f"--name={cluster}",
        "--real-node",
        "--install-deps",
        "--recreate",
    ]
    proc = _logged(cmd, log, timeout=3600)
    if proc.returncode != 0:
        raise SetupError(f"the local control plane did not start (log: {log}):\n{_tail(proc)}")


def load_images(cluster: str, archives: dict[str, Path], log: Path) -> None:
    """The archives into the node's containerd (an unchanged image is not imported again)."""
    cmd = [sys.executable, str(DEVCLUSTER), "load-images", f"--name={cluster}", *map(str, archives.values())]
    proc = _logged(cmd, log, timeout=1800)
    if proc.returncode != 0:
        raise SetupError(f"the images could not be loaded into the node (log: {log}):\n{_tail(proc)}")


def restricted_namespace(kubectl: Kubectl, namespace: str) -> None:
    kubectl.run("create", "namespace", namespace, check=False)
    kubectl.run("label", "--overwrite", "namespace", namespace, RESTRICTED)


def helm_binary() -> Path:
    sys.path.insert(0, str(REPO / "tools" / "devcluster"))
    try:
        from build import bin_by_name, ensure_one

        return ensure_one(bin_by_name()["helm"])
    finally:
        sys.path.pop(0)


def install_operator(kubectl: Kubectl, archive: Path, log: Path) -> None:
    """charts/rljob installed (or upgraded) by helm in a namespace that enforces `restricted`, with
    the image just loaded into the node (pull policy Never: no registry here)."""
    restricted_namespace(kubectl, inpods.OPERATOR_NAMESPACE)
    cmd = [
        str(helm_binary()), f"--kubeconfig={kubectl.kubeconfig}",
        "upgrade", "--install", inpods.OPERATOR_RELEASE, str(CHART),
        "--namespace", inpods.OPERATOR_NAMESPACE,
        "--set", "image.pullPolicy=Never",
        # The archive's name carries its inputs' hash: a rebuilt image under the same tag changes
        # the pod template, so helm rolls the operator onto it; an unchanged one leaves it running.
        "--set-string", f"podAnnotations.rljob\\.dev/image-archive={archive.name}",
        "--wait", "--timeout=5m",
    ]  # fmt: skip
    proc = _logged(cmd, log, timeout=400)
    if proc.returncode != 0:
        raise SetupError(f"helm could not install the operator (log: {log}):\n{_tail(proc)}")


def uninstall_operator(kubectl: Kubectl) -> bool:
    """helm uninstall of the demo's release; False when it was not installed."""
    proc = subprocess.run(
        [
            str(helm_binary()), f"--kubeconfig={kubectl.kubeconfig}",
            "uninstall", inpods.OPERATOR_RELEASE, "-n", inpods.OPERATOR_NAMESPACE, "--wait",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    kubectl.run(
        "delete", "namespace", inpods.OPERATOR_NAMESPACE, "--ignore-not-found", "--wait=false", check=False
    )
    return proc.returncode == 0


def fill_data(data_dir: Path, model_dir: Path, example: dict[str, Any]) -> None:
    """The data volume's files: the model (copied when missing or changed) and the data files,
    readable by the images' user."""
    target = data_dir / inpods.MODEL_DIR
    if _fingerprint(model_dir) != _fingerprint(target):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(model_dir, target)
    for rel in inpods.data_files(example):
        shutil.copy2(REPO / rel, data_dir / Path(rel).name)
    for path in [data_dir, *data_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _fingerprint(directory: Path) -> list[tuple[str, int]]:
    if not directory.is_dir():
        return []
    return sorted(
        (str(p.relative_to(directory)), p.stat().st_size) for p in directory.rglob("*") if p.is_file()
    )


def run_checkpoint_dir(run_dir: Path) -> Path:
    """This run's checkpoint directory on the runs volume, writable by the images' user (the kubelet
    would create a missing subPath as root)."""
    path = run_dir / "checkpoints"
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, inpods.IMAGE_USER, inpods.IMAGE_USER)
    return path


def apply_volumes(kubectl: Kubectl, namespace: str, data_dir: Path, runs_dir: Path) -> None:
    """The data and runs volumes and their claims. A volume released by an earlier demo's claim
    (`make demo-down` deleted the namespace) cannot bind again: it is deleted and made anew (its
    files stay: Retain)."""
    objs = inpods.volumes(namespace, data_dir, runs_dir)
    for obj in objs:
        if obj["kind"] != "PersistentVolume":
            continue
        name = obj["metadata"]["name"]
        current = kubectl.json("get", "pv", "--field-selector", f"metadata.name={name}")["items"]
        if current and (current[0].get("status") or {}).get("phase") in ("Released", "Failed"):
            kubectl.run("delete", "pv", name, "--wait=true", "--timeout=60s")
    kubectl.run("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))


def delete_volumes(kubectl: Kubectl) -> None:
    """The demo's PersistentVolumes (their files stay on this machine)."""
    kubectl.run(
        "delete", "pv", "-l", "app.kubernetes.io/part-of=rljob-demo", "--ignore-not-found", check=False
    )


def wait_bound(kubectl: Kubectl, namespace: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    names = (inpods.data_claim(namespace), inpods.runs_claim(namespace))
    while True:
        phases = [((kubectl.get("pvc", n, namespace) or {}).get("status") or {}).get("phase") for n in names]
        if all(p == "Bound" for p in phases):
            return
        if time.monotonic() > deadline:
            raise SetupError(
                f"the demo's volume claims are not Bound after {timeout:.0f} s: {dict(zip(names, phases, strict=True))}"
            )
        time.sleep(1)
