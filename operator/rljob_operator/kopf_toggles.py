"""kopf's readiness toggles without waking every waiter at every change.

With index handlers (watch_cache.py), kopf holds every object's handlers until all indices have their
first listing: each object seen before then gets a toggle in one `ToggleSet(all)`, dropped once it is
indexed, and each worker waits on the set's condition. kopf's `make_toggle` and `drop_toggle` call
`notify_all` whatever changed, and every woken waiter re-evaluates the whole set: quadratic (or worse)
in the objects at start. An operator started among 4000 objects (1000 jobs, their RayJobs and pods)
spent minutes in it before handling any event. The waiters of a set wait for its aggregate state, so
they need waking only when that flips; `install()` makes the set notify then (a toggle's own
`turn_to` still always notifies). kopf 1.45's `ToggleSet`; left alone if it has changed."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kopf._cogs.aiokits import aiotoggles

log = logging.getLogger("rljob.operator")
_PATCHED = "_rljob_notifies_on_change"


async def _make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> aiotoggles.Toggle:
    toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggles(self: Any, toggles: Iterable[aiotoggles.Toggle]) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != before:
            self._condition.notify_all()


async def _drop_toggle(self: Any, toggle: aiotoggles.Toggle) -> None:
    await _drop_toggles(self, (toggle,))


def install() -> bool:
    """Patch kopf's ToggleSet; False when its internals are not the ones this was written for."""
    cls = aiotoggles.ToggleSet
    if getattr(cls, _PATCHED, False):
        return True
    probe = cls(all)
    if not all(hasattr(probe, attr) for attr in ("_condition", "_toggles")) or not all(
        hasattr(cls, method) for method in ("make_toggle", "drop_toggle", "drop_toggles")
    ):
        log.warning("kopf's ToggleSet has changed: its readiness toggles are left as they are")
        return False
    cls.make_toggle = _make_toggle  # type: ignore[method-assign]
    cls.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    cls.drop_toggles = _drop_toggles  # type: ignore[method-assign]
    setattr(cls, _PATCHED, True)
    return True
