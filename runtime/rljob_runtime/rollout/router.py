"""The real sglang-router as a child process, with worker membership managed by us.

The router's own health checks, circuit breaker and retries are disabled (as slime does): the
fleet's health checks decide membership, and ``generate`` owns the retry policy. Left on, a dead
cache-affine worker keeps receiving traffic until the breaker opens, and two retry layers multiply.
Membership changes are asynchronous in the router (``POST /workers`` answers 202); ``add_worker`` /
``remove_worker`` wait until ``GET /workers`` shows the change.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..net import free_port
from . import procs

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


class RouterError(RuntimeError):
    """The router did not start, or refused a membership change."""


def router_command(
    *, host: str, port: int, metrics_port: int, policy: str = "cache_aware", log_level: str = "warn"
) -> list[str]:
    if policy not in POLICIES:
        raise ValueError(f"router policy {policy!r}: expected one of {', '.join(POLICIES)}")
    return [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--policy",
        policy,
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
        "--disable-health-check",
        "--disable-circuit-breaker",
        "--disable-retries",
        "--log-level",
        log_level,
    ]


def _request(method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as err:
        status, raw = int(err.code), err.read()
    except (OSError, ValueError) as err:
        return -1, str(err)
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


@dataclass
class Worker:
    id: str
    url: str
    healthy: bool


class Router:
    """One sglang-router process; ``url`` is where ``/generate`` goes."""

    def __init__(self, proc: Any, url: str, metrics_port: int, log_path: Path) -> None:
        self._proc = proc
        self.url = url
        self.metrics_port = metrics_port
        self.log_path = log_path

    @classmethod
    def start(
        cls,
        *,
        policy: str = "cache_aware",
        host: str = "127.0.0.1",
        log_dir: str | Path | None = None,
        timeout_s: float = 60.0,
    ) -> Router:
        """Launch the router on free ports and wait until it answers ``GET /workers``."""
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="rljob-router-"))
        log_path = log_dir / "router.log"
        for attempt in range(3):
            port, metrics_port = free_port(host), free_port(host)
            cmd = router_command(host=host, port=port, metrics_port=metrics_port, policy=policy)
            proc = procs.spawn(cmd, log_path=log_path)
            router = cls(proc, f"http://{host}:{port}", metrics_port, log_path)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                if _request("GET", f"{router.url}/workers", timeout=5)[0] == 200:
                    return router
                time.sleep(0.2)
            router.stop()
            tail = procs.log_tail(log_path)
            # lost a race for a port: try others
            if "address already in use" in tail.lower() and attempt < 2:
                continue
            raise RouterError(f"sglang-router did not come up in {timeout_s:.0f} s; log {log_path}:\n{tail}")
        raise AssertionError("unreachable")

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def workers(self) -> list[Worker]:
        status, answer = _request("GET", f"{self.url}/workers")
        if status != 200 or not isinstance(answer, dict):
            raise RouterError(f"GET {self.url}/workers: {status} {answer}")
        return [
            Worker(id=str(w["id"]), url=str(w["url"]), healthy=bool(w.get("is_healthy", True)))
            for w in answer.get("workers", [])
        ]

    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers()]

    def add_worker(self, url: str, timeout_s: float = 60.0) -> None:
        """Register ``url`` and wait until the router lists it healthy."""
        status, answer = _request("POST", f"{self.url}/workers", {"url": url, "worker_type": "regular"})
        if not 200 <= status < 300:
            raise RouterError(f"POST {self.url}/workers {url}: {status} {answer}")
        self._wait(
            f"{url} listed healthy",
            lambda: any(w.url == url and w.healthy for w in self.workers()),
            timeout_s,
        )

    def remove_worker(self, url: str, timeout_s: float = 30.0) -> bool:
        """Deregister ``url`` (by its id) and wait until it is gone; False if it was not registered."""
        matches = [w for w in self.workers() if w.url == url]
        for worker in matches:
            status, answer = _request("DELETE", f"{self.url}/workers/{worker.id}")
            if not 200 <= status < 300 and status != 404:
                raise RouterError(f"DELETE {self.url}/workers/{worker.id} ({url}): {status} {answer}")
        if matches:
            self._wait(f"{url} removed", lambda: url not in self.worker_urls(), timeout_s)
        return bool(matches)

    def _wait(self, what: str, check: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RouterError(
                    f"router exited while waiting for {what}; log:\n{procs.log_tail(self.log_path)}"
                )
            if check():
                return
            time.sleep(0.1)
        raise RouterError(f"router: timed out after {timeout_s:.0f} s waiting for {what}")

    def stop(self) -> None:
        """Stop the router (SIGTERM, SIGKILL after 5 s); idempotent."""
        procs.kill_group(self._proc, grace_s=5.0)
