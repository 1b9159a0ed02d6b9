"""Phase changes that a previous operator wrote but did not announce, announced once at start.

A pass writes a job's status, then posts the event that announces its phase change ("Pending ->
Starting: ...", status.announcement). An operator that ends between the two (killed, or a leader
that lost its lease and exited) leaves the change unannounced, and its successor reads the new
phase as the job's current one: it has no change to announce. So before it handles any event, the
operator compares each job's phase with the last phase change announced on it (the operator's own
events on the job, by the job's uid) and posts the missing one: "<last announced> -> <phase>:
<Ready's message>", the event the pass would have posted. Only one change can be missing per job
(a job has one pass at a time, and the operator posts each announcement right after its write).

A job without any announcement is caught up only when it is younger than the API server keeps
events (an hour by default, `--event-ttl`), less a margin: an older job's announcements may simply
have expired.

`missing()` is pure; `announce_missing()` reads the jobs and events and posts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from rljob_api.resource import KIND

from .kube import EVENT_COMPONENT, Kube, load_config
from .permissions import describe_api_error
from .status import announcement

log = logging.getLogger("rljob.operator")

EVENT_TTL_MARGIN = timedelta(minutes=50)
_CHANGE = re.compile(r"^(\w+) -> (\w+): ")
SELECTOR = f"involvedObject.kind={KIND},source={EVENT_COMPONENT}"


def last_announced(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Job uid -> the phase its newest phase-change event announced."""
    newest: dict[str, tuple[str, str]] = {}
    for event in events:
        found = _CHANGE.match(event.get("message") or "")
        uid = (event.get("involvedObject") or {}).get("uid")
        if found is None or not uid:
            continue
        stamp = event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp") or ""
        if uid not in newest or stamp >= newest[uid][0]:
            newest[uid] = (stamp, found.group(2))
    return {uid: phase for uid, (_, phase) in newest.items()}


def _created(job: Mapping[str, Any]) -> datetime | None:
    stamp = job["metadata"].get("creationTimestamp")
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def missing(
    jobs: Iterable[Mapping[str, Any]], announced: Mapping[str, str], now: datetime
) -> list[tuple[Mapping[str, Any], tuple[str, str, str]]]:
    """(job, (type, reason, message)) for each job whose phase differs from the last one announced."""
    out = []
    for job in jobs:
        meta, status = job["metadata"], job.get("status") or {}
        phase, uid = status.get("phase"), meta.get("uid")
        if not phase or not uid or meta.get("deletionTimestamp"):
            continue
        last = announced.get(uid)
        if last == phase:
            continue
        if last is None:
            created = _created(job)
            if created is None or now - created > EVENT_TTL_MARGIN:
                continue  # its announcements may have expired
        try:
            event = announcement({"phase": last} if last else {}, status)
        except (KeyError, StopIteration, TypeError):
            continue  # a status without Ready (not the operator's shape): nothing to say
        if event is not None:
            out.append((job, event))
    return out


class EventsKube(Kube):
    async def list_operator_events(self, namespace: str | None) -> list[dict[str, Any]]:
        """The operator's events on jobs, in one namespace or all."""
        if namespace:
            return await self._pages(self.core.list_namespaced_event, namespace, field_selector=SELECTOR)
        return await self._pages(self.core.list_event_for_all_namespaces, field_selector=SELECTOR)


async def announce_missing(namespaces: tuple[str, ...]) -> int:
    """Post the missing announcements of the jobs in `namespaces` (empty: all); how many were posted.
    Best effort: a failure is logged, never raised (the operator starts all the same)."""
    await load_config()
    kube = EventsKube()
    posted = 0
    try:
        jobs, events = [], []
        for namespace in namespaces or (None,):
            jobs += await kube.list_jobs(namespace)
            events += await kube.list_operator_events(namespace)
        for job, (type_, reason, message) in missing(jobs, last_announced(events), datetime.now(UTC)):
            await kube.post_event(job, type_, reason, message)
            log.info(
                "announced a phase change its previous operator did not: %s/%s %s",
                job["metadata"]["namespace"],
                job["metadata"]["name"],
                message.split(":", 1)[0],
            )
            posted += 1
    except Exception as exc:
        log.warning("cannot catch up on unannounced phase changes: %s", describe_api_error(exc))
    finally:
        await kube.close()
    return posted
