"""The live view: `kubectl get rljobs` rows as they change, with the job's events in between.

`View` is pure (snapshots in, lines out) so what the user sees is unit tested; `poll` does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Snapshot:
    table: list[str]  # `kubectl get rljobs <name>` output: header and one row
    status: dict[str, Any]
    events: list[dict[str, Any]]  # core/v1 Events of the job, oldest first

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")

    @property
    def progress(self) -> dict[str, Any]:
        return self.status.get("progress") or {}

    @property
    def message(self) -> str:
        for cond in self.status.get("conditions") or []:
            if cond.get("type") == "Ready":
                return str(cond.get("message") or "")
        return ""

    def key(self) -> tuple[Any, ...]:
        """What makes a new table row worth printing (AGE alone does not)."""
        p = self.progress
        return (self.phase, p.get("stepText"), p.get("rewardMean"))


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:d}:{secs:02d}"


@dataclass
class View:
    header_printed: bool = False
    last_key: tuple[Any, ...] | None = None
    last_message: str = ""
    seen_events: set[tuple[str, int]] = field(default_factory=set)
    phases: list[str] = field(default_factory=list)

    def update(self, snap: Snapshot, elapsed: float) -> list[str]:
        """Lines to print for this snapshot: new events, then the row if it changed, then the
        condition message if it changed."""
        lines = [f"{'':6} event  {e}" for e in self._new_events(snap.events)]
        if snap.phase and (not self.phases or self.phases[-1] != snap.phase):
            self.phases.append(snap.phase)
        if len(snap.table) >= 2 and snap.key() != self.last_key:
            if not self.header_printed:
                lines.insert(0, f"{'TIME':6} {snap.table[0]}")
                self.header_printed = True
            lines.append(f"{clock(elapsed):6} {snap.table[1]}")
            self.last_key = snap.key()
        if snap.message and snap.message != self.last_message:
            lines.append(f"{'':6} ↳ {snap.message}")
            self.last_message = snap.message
        return lines

    def _new_events(self, events: Iterable[dict[str, Any]]) -> list[str]:
        out = []
        for event in events:
            ident = (str(event.get("metadata", {}).get("uid")), int(event.get("count") or 1))
            if ident in self.seen_events:
                continue
            self.seen_events.add(ident)
            out.append(
                f"{event.get('type', ''):7} {event.get('reason', '')}: {event.get('message', '')}".rstrip()
            )
        return out
