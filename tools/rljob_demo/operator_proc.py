"""The rljob operator as a background process owned by the demo: the local control plane's nodes
are kwok's and run no containers, so the chart's Deployment (charts/rljob) cannot run it here.
Started once, reused by later `make demo` runs, stopped by `make demo-down` (or by the e2e tests,
which run operators of their own)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class OperatorInfo:
    pid: int
    health_port: int
    metrics_port: int
    log: str
    cluster: str = ""  # cluster_fingerprint of the control plane it serves ("" in older state files)

    @property
    def healthz(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through HTTP_PROXY
    try:
        with opener.open(url, timeout=2):
            return True
    except OSError:
        return False


def _is_operator(pid: int) -> bool:
    """The pid is alive and still an rljob operator (pids are reused after a reboot)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"rljob_operator" in cmdline


def cluster_fingerprint(kubeconfig: Path) -> str:
    """Which control plane a kubeconfig reaches: a hash of it and of the CA certificate it names. A
    control plane started again (same name, same port) has a new CA, so an operator still holding the
    old one, which can no longer verify the API server, is not taken for this cluster's."""
    import hashlib

    import yaml

    digest = hashlib.sha256(kubeconfig.read_bytes())
    for entry in (yaml.safe_load(kubeconfig.read_text()) or {}).get("clusters") or []:
        ca = (entry.get("cluster") or {}).get("certificate-authority")
        if ca and Path(ca).is_file():
            digest.update(Path(ca).read_bytes())
    return digest.hexdigest()[:16]


def load(state_file: Path) -> OperatorInfo | None:
    try:
        return OperatorInfo(**json.loads(state_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running(state_file: Path) -> OperatorInfo | None:
    """The demo's operator when it is alive and healthy, else None."""
    info = load(state_file)
    if info and _is_operator(info.pid) and _get(info.healthz):
        return info
    return None


def start(state_file: Path, kubeconfig: Path, timeout: float = 90) -> OperatorInfo:
    """Start the operator detached from this terminal (Ctrl-C on the demo leaves it running)."""
    log = state_file.with_name("operator.log")
    info = OperatorInfo(
        pid=0,
        health_port=_free_port(),
        metrics_port=_free_port(),
        log=str(log),
        cluster=cluster_fingerprint(kubeconfig),
    )
    cmd = [
        sys.executable, "-m", "rljob_operator",
        f"--metrics-port={info.metrics_port}",
        f"--liveness={info.healthz}",
        "--resync-seconds=10",
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    info.pid = proc.pid
    state_file.write_text(json.dumps(asdict(info)))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {proc.returncode}; its log: {log}\n{tail(log)}")
        if _get(info.healthz):
            return info
        time.sleep(0.5)
    stop(state_file)
    raise RuntimeError(f"the operator was not healthy after {timeout:.0f} s; its log: {log}\n{tail(log)}")


def stop(state_file: Path, timeout: float = 30) -> bool:
    """Stop the demo's operator (SIGTERM, then SIGKILL); True when one was running."""
    info = load(state_file)
    state_file.unlink(missing_ok=True)
    if not info or not _is_operator(info.pid):
        return False
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_operator(info.pid):
        time.sleep(0.2)
    if _is_operator(info.pid):
        os.kill(info.pid, signal.SIGKILL)
    return True


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
