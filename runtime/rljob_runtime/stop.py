"""`rljob-runtime stop`: SIGTERM to the `rljob-runtime train` processes of this pod, then wait for
them to exit. The head pod's preStop hook runs it.

Why a hook: when a RayJob is suspended (Kueue preemption, `spec.suspend`) KubeRay deletes the Ray
cluster without stopping the Ray job, and the driver runs in a session of its own under Ray's job
supervisor, so the SIGTERM the kubelet sends the head container never reaches it (only the SIGKILL
at the end of the grace period does). The hook gives the runtime the SIGTERM it checkpoints on
(preemption.py), and holds the container until the runtime has exited.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

_SHELLS = {"sh", "bash", "dash"}


def is_train_process(argv: list[str]) -> bool:
    """Whether a command line is `rljob-runtime train ...` itself (the console script or
    `python -m rljob_runtime.cli`), not a shell that runs it: the shell must not get the SIGTERM, its
    death would end the Ray job before the runtime's checkpoint."""
    if not argv or os.path.basename(argv[0]) in _SHELLS:
        return False
    runtime = next(
        (
            i
            for i, arg in enumerate(argv)
            if os.path.basename(arg) == "rljob-runtime"
            or (arg == "rljob_runtime.cli" and i > 0 and argv[i - 1] == "-m")
        ),
        None,
    )
    return runtime is not None and "train" in argv[runtime + 1 : runtime + 2]


def train_processes(proc: Path = Path("/proc"), *, exclude: Iterable[int] = ()) -> list[int]:
    """PIDs of the train processes visible under ``proc``."""
    skip = set(exclude)
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if is_train_process([a.decode(errors="replace") for a in argv if a]):
            found.append(int(entry.name))
    return sorted(found)


def stop(
    timeout_s: float,
    *,
    proc: Path = Path("/proc"),
    kill: Callable[[int, int], None] = os.kill,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[int], list[int]]:
    """SIGTERM every train process, then wait up to ``timeout_s`` for them to exit; (signalled, left)."""
    pids = train_processes(proc, exclude=[os.getpid()])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGTERM)
    deadline = clock() + timeout_s
    left = [p for p in pids if running(proc / str(p))]
    while left and clock() < deadline:
        sleep(0.5)
        left = [p for p in left if running(proc / str(p))]
    return pids, left


def running(entry: Path) -> bool:
    """Whether the process of a /proc entry still runs: an exited one its parent has not reaped
    yet (a zombie, state Z) has finished."""
    try:
        stat = (entry / "stat").read_text()
    except FileNotFoundError:
        return entry.exists()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] != "Z"
