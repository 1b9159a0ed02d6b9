"""The rljob operator as a real process against the test cluster (what users run, killable)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMAGE_DEPS = Path(__file__).resolve().parent / "operator_image_deps"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        resync_seconds: float = 5.0,
        args: tuple[str, ...] = ("--secret-preflight",),
    ) -> None:
        """`args`: extra flags (the admin kubeconfig may read Secrets, so the pre-flight runs)."""
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.resync_seconds = resync_seconds
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.health_port = 0
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self, timeout: float = 60, attempts: int = 3) -> None:
        """Launches and waits until healthy. The ports free_port() chose may be taken by another
        process before the operator binds them: that start is retried on new ports."""
        for attempt in range(attempts):
            self.launch()
            try:
                self.wait_healthy(timeout)
                return
            except RuntimeError:
                if attempt == attempts - 1 or not self.lost_its_port():
                    raise

    def lost_its_port(self) -> bool:
        """It exited because a port free_port() chose was taken before it bound it: launch again."""
        return (
            self.proc is not None
            and self.proc.poll() is not None
            and "address already in use" in self.log_tail().lower()
        )

    def launch(self) -> None:
        """Starts the process without waiting for it (several can then start at once)."""
        self.starts += 1
        self.metrics_port, self.health_port = free_port(), free_port()
        # As in the operator image: no synchronous `kubernetes` client importable.
        path = os.pathsep.join(p for p in (str(IMAGE_DEPS), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONPATH": path}
        cmd = [
            sys.executable, "-m", "rljob_operator",
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            f"--resync-seconds={self.resync_seconds}",
            *self.args,
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout: float = 60) -> None:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rljob-operator exited {self.proc.returncode}:\n{self.log_tail()}")
            if self._get(f"http://127.0.0.1:{self.health_port}/healthz") is not None:
                return
            time.sleep(0.5)
        raise RuntimeError(f"rljob-operator not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: the harshest way to stop it (no cleanup handlers run)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> str:
        return self._get(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @staticmethod
    def _get(url: str) -> str | None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=2) as resp:
                return resp.read().decode()
        except OSError:
            return None


def wait_for(what: str, check: Callable[[], Any], operator: OperatorProcess, timeout: float = 180) -> Any:
    """`check()`'s first truthy value, polled each second; past `timeout` the test fails with the last
    value and the operator's log."""
    import pytest

    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    pytest.fail(
        f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\noperator log:\n{operator.log_tail()}",
        pytrace=False,
    )
