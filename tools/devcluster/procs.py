"""Process, port, pid, lock and HTTP utilities."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import LOOPBACK, HarnessError, cache_root, log


@contextlib.contextmanager
def file_lock(
    path: Path, poll: float = 1.0, say_after: float = 0.0, holder: str = "another devcluster command"
) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            said = False
            while True:
                waited = time.monotonic() - t0
                if not said and waited >= say_after:
                    log(f"waiting for the lock {path} ({holder} is running)")
                    said = True
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if waited > 1800:
                        raise HarnessError("lock", f"{path} held for more than 30 minutes") from None
                    time.sleep(poll)
            if said:
                log(f"got the lock {path} after {time.monotonic() - t0:.1f} s")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# Ports: a port found free is closed again before the server that gets it binds it, so two clusters
# starting at once (the `make demo` e2e test beside the shared cluster) could be handed the same one.
# Every choice of ports is made under one lock for all clusters of this cache (machine_lock), and the
# ports handed out are written down (PORTS_FILE) and not handed out again for PORT_HOLD_S, long after
# their server has bound them. kwokctl picks its own ports (counting down from 32767, checking each by
# binding it): `kwokctl create cluster` runs under the same lock, until its servers are up.
MACHINE_LOCK = "devcluster.lock"
PORTS_FILE = "devcluster-ports.json"
PORT_HOLD_S = 600.0
_machine_lock_depth = 0


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """The lock for port choices and control plane starts, shared by every cluster of this cache.
    Re-entrant within a process (flock would block on a second open of the same file)."""
    global _machine_lock_depth
    if _machine_lock_depth:
        _machine_lock_depth += 1
        try:
            yield
        finally:
            _machine_lock_depth -= 1
        return
    with file_lock(
        cache_root() / MACHINE_LOCK,
        poll=0.1,
        say_after=2.0,
        holder="another cluster choosing ports or starting",
    ):
        _machine_lock_depth = 1
        try:
            yield
        finally:
            _machine_lock_depth = 0


def _ports_handed_out(now: float) -> dict[int, float]:
    """Port -> until when it stays reserved (call under machine_lock); expired entries dropped."""
    try:
        raw = json.loads((cache_root() / PORTS_FILE).read_text())
        return {int(p): float(t) for p, t in raw.items() if float(t) > now}
    except (OSError, ValueError, AttributeError):
        return {}


def _kernel_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now and not handed out by another devcluster command in the last
    PORT_HOLD_S seconds (on any cluster of this cache); recorded as handed out."""
    with machine_lock():
        now = time.time()
        taken = _ports_handed_out(now)
        ports: set[int] = set()
        tries = 0
        while len(ports) < n:
            tries += 1
            if tries > 100 * (n + 1):
                raise HarnessError("ports", f"no {n} free ports outside the {len(taken)} handed out lately")
            port = _kernel_free_port()
            if port not in taken:
                ports.add(port)
        taken.update((p, now + PORT_HOLD_S) for p in ports)
        path = cache_root() / PORTS_FILE
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({str(p): t for p, t in sorted(taken.items())}) + "\n")
        tmp.replace(path)
    return sorted(ports)


def port_bound(port: int, host: str = LOOPBACK) -> bool:
    """Whether something listens on ``host:port`` (it cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids_matching(marker: str) -> list[int]:
    """Our processes whose command line mentions ``marker`` (a path unique to this cluster)."""
    me = os.getpid()
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != me and marker in cmdline(int(p.name)):
            out.append(int(p.name))
    return out


def pids_with_env(key: str, value: str) -> list[int]:
    """Our processes whose environment holds ``key=value`` (inherited by every descendant)."""
    needle = f"{key}={value}".encode()
    me = os.getpid()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            out.append(int(p.name))
    return out


def stop_pid(pid: int, marker: str, what: str, grace: float = 15.0) -> None:
    """Stops one process (and its process group, when it leads one) that we started.

    ``marker`` must appear in its command line, so a recycled pid is never signalled.
    """
    if not pid_alive(pid) or marker not in cmdline(pid):
        return
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    group = pgid == pid  # started with start_new_session=True
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if not pid_alive(pid):
            return
        log(f"{what} (pid {pid}) still running {grace:.0f} s after SIGTERM; sending SIGKILL")


def spawn(cmd: list[str], logfile: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=logfile.parent,
        )


def http_get(url: str, timeout: float = 3.0, proxy: str | None = None) -> tuple[int, bytes]:
    handler = urllib.request.ProxyHandler({"http": proxy} if proxy else {})
    opener = urllib.request.build_opener(handler)
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    log_path: Path | None = None,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.5,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise HarnessError(
                what, f"process exited with code {proc.returncode} before it was ready", log_path
            )
        time.sleep(interval)
    raise HarnessError(what, f"not ready after {timeout:.0f} s", log_path)
