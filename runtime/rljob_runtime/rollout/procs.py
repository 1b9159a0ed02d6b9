"""Child processes that must not outlive their owner (engine servers, the router), and free ports.

Every child gets its own process group (so a hard kill takes its grandchildren too, e.g. SGLang's
scheduler processes) and, on Linux, ``PR_SET_PDEATHSIG`` = SIGKILL: if the owner dies without
running any cleanup (``ray.kill`` of an actor is a SIGKILL), the kernel kills the child anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _libc_prctl() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# Loaded before any fork: the child may only make async-signal-safe calls between fork and exec.
_LIBC = _libc_prctl()


def _die_with_parent() -> None:
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(
    cmd: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own process group, output to ``log_path``, killed if this process dies.

    PDEATHSIG fires when the *thread* that forked exits, so callers spawn from a long-lived thread
    (the main thread, or a dedicated one: see ``EngineActor``).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def kill_group(proc: subprocess.Popen[bytes] | None, *, grace_s: float = 0.0) -> None:
    """Kill the process and its group: SIGTERM then SIGKILL after ``grace_s`` (0: SIGKILL at once).

    Idempotent; always reaps the process so it leaves no zombie.
    """
    if proc is None:
        return
    if proc.poll() is None and grace_s > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    # the group may hold grandchildren even after the leader exited
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def log_tail(path: Path | None, chars: int = 3000) -> str:
    if path is None or not path.exists():
        return ""
    data = path.read_bytes()[-chars:]
    return data.decode(errors="replace")


def group_pids(pgid: int) -> set[int]:
    """PIDs of the processes in process group ``pgid`` (an engine server and its workers)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    pids.add(int(entry.name))
    return pids


def group_gpu_memory_gb(pgid: int) -> float:
    """GPU memory (GB, every device) held by process group ``pgid``, from NVML; -1 when NVML is
    missing or sees none of the group's PIDs (a container may show NVML other PIDs)."""
    try:
        import pynvml
    except ImportError:
        return -1.0
    pids = group_pids(pgid)
    try:
        pynvml.nvmlInit()
        try:
            used, seen = 0, False
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid in pids:
                        used, seen = used + int(process.usedGpuMemory or 0), True
            return used / 1e9 if seen else -1.0
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return -1.0
