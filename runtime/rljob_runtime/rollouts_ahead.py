"""Async mode's rollout producer: step rollouts made one after another on a thread of their own, at
most ``rollout.async.bufferSize`` of them ahead of the trainer (made and waiting, or being made).

The driver ``take``s the next one for each step. Around a weight push (without partial rollout), a
checkpoint and an evaluation it holds the producer ``quiet``: no rollout starts, and the one being
made is finished first, so the weights never change mid-request, the data position saved is the one
of the rollouts saved with it (``buffered``), and eval requests are not aborted by dynamic sampling.
``StepRollouts`` is what the driver takes each step's rollout from: this producer in async mode,
else one made at once.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from .step_rollout import StepRollout, step_rollout

if TYPE_CHECKING:
    from .prepare import Prepared
    from .rollout.base import Rollout


class RolloutsAhead:
    """See the module docstring. ``produce`` makes one step's rollout; ``count`` rollouts are made
    in all (the steps left after those in ``ready``, restored from a checkpoint)."""

    def __init__(
        self,
        produce: Callable[[], StepRollout],
        *,
        depth: int,
        count: int,
        ready: Sequence[StepRollout] = (),
    ) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self._produce = produce
        self.depth = depth
        self._left = count
        self._ready: list[StepRollout] = list(ready)
        self._making = False
        self._holds = 0
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rljob-rollouts-ahead", daemon=True)
        self._thread.start()

    def _may_start(self) -> bool:
        return not self._closed and not self._holds and len(self._ready) < self.depth and self._left > 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._may_start():
                    if self._closed or (self._left == 0):
                        return
                    self._cond.wait()
                self._making = True
                self._left -= 1
            try:
                made = self._produce()
            except BaseException as exc:
                with self._cond:
                    self._error = exc
                    self._making = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready.append(made)
                self._making = False
                self._cond.notify_all()

    def take(self) -> StepRollout:
        """The next step's rollout (waiting for it while it is made); the producer's error if it failed."""
        with self._cond:
            while not self._ready:
                if self._error is not None:
                    raise self._error
                if self._closed or (not self._making and self._left == 0):
                    raise RuntimeError("no rollout left to take")
                self._cond.wait()
            out = self._ready.pop(0)
            self._cond.notify_all()
            return out

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No rollout is being made inside (the one in progress is finished first); the producer's
        error, if it failed meanwhile, is raised here."""
        with self._cond:
            self._holds += 1
            while self._making:
                self._cond.wait()
            error = self._error
        try:
            if error is not None:
                raise error
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    def buffered(self) -> list[StepRollout]:
        """The rollouts made and not yet taken, oldest first (call inside ``quiet``: a checkpoint)."""
        with self._cond:
            return list(self._ready)

    @property
    def making(self) -> bool:
        with self._cond:
            return self._making

    def close(self, *, wait: bool = True) -> None:
        """Stop making rollouts; with ``wait``, wait for the one in progress (its result is dropped:
        its prompts return with the data position of the checkpoint a restart loads). Without, an
        interrupted run does not wait for a generation (the thread is a daemon)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while wait and self._making:
                self._cond.wait()


class StepRollouts:
    """Where each step's rollout comes from for the driver: made now (sync), or by a ``RolloutsAhead``
    (async); the rollouts a checkpoint saved go first."""

    def __init__(self, prepared: Prepared, rollout: Rollout, start: int, buffered: list[StepRollout]) -> None:
        spec = prepared.spec
        self.prepared, self.rollout = prepared, rollout
        self.backlog = list(buffered)
        self.ahead: RolloutsAhead | None = None
        if spec.rollout.async_.enabled:
            self.ahead = RolloutsAhead(
                functools.partial(step_rollout, prepared, rollout),
                depth=spec.rollout.async_.buffer_size,
                count=max(0, spec.training.num_rollout - start - len(self.backlog)),
                ready=self.backlog,
            )
            self.backlog = []

    def take(self) -> StepRollout:
        if self.ahead is not None:
            return self.ahead.take()
        if self.backlog:
            return self.backlog.pop(0)
        return step_rollout(self.prepared, self.rollout)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[list[StepRollout]]:
        """No rollout is being made inside; yields those made and not yet taken (a checkpoint's)."""
        if self.ahead is None:
            yield list(self.backlog)
            return
        with self.ahead.quiet():
            yield self.ahead.buffered()

    def close(self, *, wait: bool) -> None:
        if self.ahead is not None:
            self.ahead.close(wait=wait)
