"""SIGTERM as a preemption (the pure half): the first SIGTERM asks the loop to stop, the watchdog
interrupts when the grace period is nearly spent, and `rljob-runtime stop` finds the train process,
never the shell that runs it. The loop's half (a checkpoint of the step in flight, the same batches
after resuming) is tests/integration/test_driver.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rljob_runtime import preemption, stop
from rljob_runtime.preemption import Preemption, unwind_time


def test_the_first_sigterm_asks_to_stop_and_the_watchdog_waits_for_the_grace_period() -> None:
    state = Preemption(grace_s=100)
    assert not state.requested
    assert state.request(50.0) is True
    assert state.request(60.0) is False  # the second one interrupts at once (the handler raises)
    assert state.requested_at == 50.0
    assert state.interrupt_at() == 50.0 + 100 - 10  # a tenth kept for stopping engines, router, Ray


@pytest.mark.parametrize(("grace", "kept"), [(10, 3.0), (30, 3.0), (300, 30.0), (4, 2.0)])
def test_the_time_kept_for_unwinding(grace: float, kept: float) -> None:
    assert unwind_time(grace) == kept


def test_the_watchdog_interrupts_the_main_thread_once_the_time_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(preemption._thread, "interrupt_main", lambda: calls.append("interrupt"))
    now = [0.0]
    state = Preemption(grace_s=10)
    state.request(0.0)
    monkeypatch.setattr(preemption.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    preemption._watchdog(state, lambda: now[0])
    assert calls == ["interrupt"] and state.interrupted
    assert now[0] >= state.interrupt_at()


def test_the_watchdog_stands_down_once_the_checkpoint_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(preemption._thread, "interrupt_main", lambda: calls.append("interrupt"))
    state = Preemption(grace_s=10)
    state.request(0.0)
    state.finished = True
    preemption._watchdog(state, lambda: 1000.0)
    assert calls == [] and not state.interrupted


def test_a_sigterm_in_this_process_is_recorded_and_a_second_one_interrupts() -> None:
    before = signal.getsignal(signal.SIGTERM)
    preemption.reset()
    preemption.configure(3600)
    try:
        preemption.install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert preemption.current().requested and not preemption.current().interrupted
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        preemption.current().finished = True
        signal.signal(signal.SIGTERM, before)
        preemption.reset()


@pytest.mark.parametrize(
    ("argv", "train"),
    [
        (["/usr/bin/python3", "/usr/local/bin/rljob-runtime", "train", "--config", "env:RLJOB_JOB"], True),
        (["/venv/bin/python", "-m", "rljob_runtime.cli", "train", "-c", "job.yaml"], True),
        (["/bin/sh", "-c", "rljob-runtime train --config env:RLJOB_JOB"], False),  # Ray's shell: never
        (["/usr/bin/python3", "/usr/local/bin/rljob-runtime", "stop", "--timeout", "300"], False),
        (["/usr/bin/python3", "/usr/local/bin/rljob-runtime", "convert", "export"], False),
        (["/usr/bin/python3", "train.py", "rljob-runtime"], False),
        ([], False),
    ],
)
def test_which_processes_stop_signals(argv: list[str], train: bool) -> None:
    assert stop.is_train_process(argv) is train


def _fake_proc(root: Path, processes: dict[int, list[str]]) -> Path:
    for pid, argv in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (root / "self").mkdir()
    return root


def test_stop_signals_the_train_processes_and_waits_for_them(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        {
            10: ["/bin/sh", "-c", "rljob-runtime train --config env:RLJOB_JOB"],
            11: ["/usr/bin/python3", "/usr/local/bin/rljob-runtime", "train", "--config", "env:RLJOB_JOB"],
            12: ["raylet"],
        },
    )
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        (proc / str(pid) / "cmdline").unlink()
        (proc / str(pid)).rmdir()  # it exits

    assert stop.stop(5, proc=proc, kill=kill) == ([11], [])
    assert sent == [(11, signal.SIGTERM)]
    assert stop.stop(5, proc=proc, kill=kill) == ([], [])  # nothing left to stop


def test_stop_gives_up_after_its_timeout(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {11: ["python", "-m", "rljob_runtime.cli", "train", "-c", "x"]})
    now = [0.0]
    signalled, left = stop.stop(
        3,
        proc=proc,
        kill=lambda pid, sig: None,
        sleep=lambda s: now.__setitem__(0, now[0] + s),
        clock=lambda: now[0],
    )
    assert (signalled, left) == ([11], [11]) and now[0] >= 3


def test_the_stop_command_stops_a_real_process() -> None:
    """The console script's argv shape in a real process: `python -m rljob_runtime.cli train` that
    sleeps until SIGTERM (a stand-in for the runtime, which `train` would start in full)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "rljob_runtime.cli", "train"],
    )
    try:
        time.sleep(0.3)
        assert child.pid in stop.train_processes()
        out = subprocess.run(
            [sys.executable, "-m", "rljob_runtime.cli", "stop", "--timeout", "20"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr  # it exited (a zombie until reaped here)
        child.wait(timeout=20)
        assert f"stopped: [{child.pid}]" in out.stdout
        assert child.returncode == -signal.SIGTERM
    finally:
        child.kill()
