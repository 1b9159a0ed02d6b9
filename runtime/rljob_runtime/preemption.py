"""SIGTERM as a preemption: Kueue preempting the job, `spec.suspend: true`, a pod deleted, a node
drained. All of them give the pods their termination grace period
(spec.faultTolerance.terminationGracePeriodSeconds) before SIGKILL.

The first SIGTERM asks the loop to stop: the step in flight finishes, a checkpoint of it is written
(unless that step already saved one), and `rljob-runtime train` exits EXIT_PREEMPTED, which the
operator reads as preempted, not failed. A watchdog thread interrupts the main thread (as Ctrl-C
does) when the grace period is nearly spent and the save has not ended: the run then unwinds with
what it has, and the resumed job goes back to its last periodic checkpoint. A second SIGTERM, or
SIGINT, interrupts at once.
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("rljob.preemption")

DEFAULT_GRACE_S = 300.0
# Kept back from the grace period for the unwinding after an interrupt: engines, router, trainer
# actors and Ray stop before SIGKILL would leave them behind.
UNWIND_S_MIN = 3.0
UNWIND_FRACTION = 0.1


def unwind_time(grace_s: float) -> float:
    """Seconds of the grace period kept for stopping everything after the watchdog interrupts."""
    return min(grace_s / 2, max(UNWIND_S_MIN, grace_s * UNWIND_FRACTION))


@dataclass
class Preemption:
    """A process's preemption state: whether a SIGTERM asked the run to stop, and by when it must end."""

    grace_s: float = DEFAULT_GRACE_S
    requested_at: float | None = None  # time.monotonic() of the first SIGTERM
    interrupted: bool = False  # the watchdog interrupted the main thread: no checkpoint of the last step
    finished: bool = False  # the run wrote its checkpoint (or had nothing to save): the watchdog stands down

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def request(self, now: float) -> bool:
        """Record a SIGTERM at ``now``; True for the first one (stop after the step), False after."""
        if self.requested_at is not None:
            return False
        self.requested_at = now
        return True

    def interrupt_at(self) -> float:
        """When the watchdog interrupts the main thread (monotonic time); only once requested."""
        assert self.requested_at is not None
        return self.requested_at + self.grace_s - unwind_time(self.grace_s)


_current = Preemption()
_lock = threading.Lock()


def current() -> Preemption:
    """This process's preemption state (signals are per process)."""
    return _current


def configure(grace_s: float) -> None:
    """The grace period of this run's pods (the spec's terminationGracePeriodSeconds)."""
    _current.grace_s = float(grace_s)


def reset() -> None:
    """A fresh state (a test, or a second run in one process)."""
    global _current
    with _lock:
        _current = Preemption(grace_s=_current.grace_s)


def install(clock: Callable[[], float] = time.monotonic) -> None:
    """SIGTERM: the first asks the loop to stop after its step (and starts the watchdog), the next
    interrupts like Ctrl-C. Installed again after ray.init, which sets a handler of its own."""

    def on_sigterm(signum: int, frame: object) -> None:
        state = _current
        if not state.request(clock()):
            raise KeyboardInterrupt
        print(
            f"rljob-runtime: SIGTERM: finishing the step in flight, then saving a checkpoint "
            f"(within the {state.grace_s:.0f}-s grace period)",
            flush=True,
        )
        threading.Thread(
            target=_watchdog, args=(state, clock), name="preemption-watchdog", daemon=True
        ).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)


def _watchdog(state: Preemption, clock: Callable[[], float]) -> None:
    while not state.finished:
        left = state.interrupt_at() - clock()
        if left <= 0:
            state.interrupted = True
            log.warning("the grace period is nearly spent and the checkpoint is not written: interrupting")
            _thread.interrupt_main()
            return
        time.sleep(min(left, 0.5))
