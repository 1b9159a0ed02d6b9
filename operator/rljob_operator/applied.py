"""What the operator last applied to each child, so a pass does not re-send an unchanged body.

A job is reconciled on every event of its RayJob and pods (KubeRay writes the RayJob's status
several times while it starts), and each pass used to re-apply the prerequisites and the RayJob: no-op
server-side applies, each a round trip with a full object back. Now a child is applied again only
when its body changed, or when the object read this pass is not the one applied (another uid, or a
spec changed since: its generation moved). Prerequisites are never read, so `forget_all` (the
periodic resync pass) makes the next pass apply everything again: a child deleted by hand comes
back within a resync period.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JobKey = tuple[str, str]  # (namespace, name)
Slot = tuple[str, str, str]  # (kind, name, field manager)


def digest(body: Mapping[str, Any]) -> bytes:
    return hashlib.blake2b(json.dumps(body, sort_keys=True).encode(), digest_size=16).digest()


@dataclass(frozen=True)
class Applied:
    digest: bytes
    uid: str | None
    generation: int | None


def _identity(obj: Mapping[str, Any]) -> tuple[str | None, int | None]:
    meta = obj.get("metadata") or {}
    return meta.get("uid"), meta.get("generation")


class AppliedChildren:
    def __init__(self) -> None:
        self._jobs: dict[JobKey, dict[Slot, Applied]] = {}

    def unchanged(
        self,
        job: JobKey,
        slot: Slot,
        body: Mapping[str, Any],
        current: Mapping[str, Any] | None,
        *,
        read: bool,
    ) -> bool:
        """True when `body` was applied last and nothing since calls for sending it again. `read`:
        the caller read the object this pass (`current`, None if missing): it must be the one applied,
        unchanged; an unread child (a prerequisite) is trusted until `forget_all`."""
        last = self._jobs.get(job, {}).get(slot)
        if last is None or last.digest != digest(body):
            return False
        if not read:
            return True
        return current is not None and _identity(current) == (last.uid, last.generation)

    def record(self, job: JobKey, slot: Slot, body: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        """`body` was applied; `result` is the object the API server returned."""
        self._jobs.setdefault(job, {})[slot] = Applied(digest(body), *_identity(result))

    def forget(self, job: JobKey) -> None:
        self._jobs.pop(job, None)

    def forget_all(self) -> None:
        self._jobs.clear()

    def jobs(self) -> set[JobKey]:
        return set(self._jobs)
