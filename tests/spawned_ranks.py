"""Two (or more) torch.distributed ranks as spawned processes for CPU tests: a free port, a deadline, and
an exit that skips torch's C++ destructors."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_then_leave(rank: int, worker: Callable[..., None], args: tuple[Any, ...]) -> None:
    worker(rank, *args)
    # What the rank started and os._exit would orphan (a SyncManager of Megatron's distributed
    # checkpointing, about 600 MB each, left running after the test session).
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)
    # After a gloo group, torch now and then aborts in a C++ destructor at interpreter exit ("terminate
    # called without an active exception", SIGABRT) once the worker's results are written: a teardown
    # crash outside what these tests check, so the rank leaves without running the destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(worker: Callable[..., None], *args: Any, nprocs: int = 2, timeout_s: float = 600.0) -> None:
    """Run worker(rank, port, *args) on `nprocs` processes; a rank that raises fails the test with its
    traceback, and ranks still running after `timeout_s` are killed and fail it (a rank waiting in a
    collective hangs instead of failing)."""
    import torch.multiprocessing as mp

    context = mp.spawn(_run_then_leave, args=(worker, (free_port(), *args)), nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"ranks still running after {timeout_s:.0f} s: a rank waits in a collective")
