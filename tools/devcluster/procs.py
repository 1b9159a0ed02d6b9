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

from common import LOOPBACK, HarnessError, log


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for the lock {path} (another devcluster command is running)")
            deadline = time.monotonic() + 1800
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise HarnessError("lock", f"{path} held for more than 30 minutes") from None
                    time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


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
