"""The operator's own writes until their watch events come back (bookkeeping, no I/O).

Two questions a pass asks about them: is the event that calls for a pass the echo of our own write
(the pass would find nothing new, so it is skipped), and may the pass trust the watch cache, or is
the cache still older than a write of ours (then it reads from the API server)?
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .job import JobKey

# A pass writes status up to three times (pending or restart, a failure, the final status) and
# applies the RayJob once; their events may come after the next pass's writes.
OWN_WRITES_KEPT = 6
# How long a RayJob the operator wrote is read from the API server while its watch event does not come
# (the resync drops older marks): the event comes within seconds unless the watch broke meanwhile.
UNSEEN_RAYJOB_SECONDS = 60
# What called for a pass: ("job", resourceVersion) for a job event, ("RayJob", name, resourceVersion)
# for an event of one of its RayJobs, None for anything else (its pods, a retry, the resync).
Cause = tuple[str, ...] | None


class OwnWrites:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # The causes our own writes made, the last few per job.
        self._causes: dict[JobKey, tuple[Cause, ...]] = {}
        # The job's version our last status write made, until its watch event arrives: till then the
        # watch cache may show the job from before that write.
        self._jobs_unseen: dict[JobKey, str] = {}
        # The training RayJobs (namespace, name) the operator applied or deleted whose watch event has
        # not arrived: till then the index may not show them (a RayJob just created is not there yet).
        # Kept past the job's forget(): a job deleted and created again at once must not take the
        # index's word that no RayJob of its name exists (an apply would take over the old job's
        # RayJob). The uid (which RayJob of that name) and when.
        self._rayjobs_unseen: dict[tuple[str, str], tuple[str, float]] = {}

    def keys(self) -> set[tuple[str, str]]:
        """Every job (and RayJob) with state here: the operator's tracked-jobs gauge counts them."""
        return set(self._causes) | set(self._jobs_unseen) | set(self._rayjobs_unseen)

    def ours(self, key: JobKey, cause: Cause) -> None:
        """A write of ours will come back as an event with this cause."""
        self._causes[key] = (*self._causes.get(key, ()), cause)[-OWN_WRITES_KEPT:]

    def echo(self, key: JobKey, cause: Cause) -> bool:
        """Is this event's cause one of our own recent writes?"""
        return cause is not None and cause in self._causes.get(key, ())

    def job_written(self, key: JobKey, version: str) -> None:
        self._jobs_unseen[key] = version

    def job_event(self, key: JobKey, version: str) -> None:
        """A job event of this version arrived (kopf indexes before it calls the handler)."""
        if self._jobs_unseen.get(key) == version:
            del self._jobs_unseen[key]

    def job_behind(self, key: JobKey) -> bool:
        """May the cache still show the job from before our last status write?"""
        return key in self._jobs_unseen

    def rayjob_written(self, namespace: str, name: str, uid: str) -> None:
        self._rayjobs_unseen[(namespace, name)] = (uid, self._clock())

    def rayjob_seen(self, namespace: str, name: str, uid: str) -> None:
        """A watch event of this RayJob (by uid: not one deleted for a restart) arrived."""
        if self._rayjobs_unseen.get((namespace, name), ("",))[0] == uid:
            del self._rayjobs_unseen[(namespace, name)]

    def rayjob_behind(self, namespace: str, name: str) -> bool:
        """May the index not show a RayJob of that name as our last write left it?"""
        return (namespace, name) in self._rayjobs_unseen

    def drop_stale_rayjob_marks(self) -> None:
        """A RayJob whose event never came (a watch re-listed meanwhile) is read from the API server
        for a minute, not forever."""
        stale = self._clock() - UNSEEN_RAYJOB_SECONDS
        for key, (_, since) in list(self._rayjobs_unseen.items()):
            if since < stale:
                del self._rayjobs_unseen[key]

    def forget_job(self, key: JobKey) -> None:
        """A deleted job's own marks go; its RayJob's stay until their event (see above)."""
        self._causes.pop(key, None)
        self._jobs_unseen.pop(key, None)
