# long-file: the Reconciler: the reads of a pass, the stages plan.py decides, and the writes they make
"""One idempotent, level-based reconcile of one RLTrainingJob.

Each pass: read the job and what exists, check what would stop it, decide admission (suspend,
Kueue, GPU quota), apply the desired children with server-side apply, compute the status (pure)
and patch /status only when it changed. Any event on the job or its children, and a slow
periodic resync, call it; errors are retried with exponential backoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rljob_api.contract import OPERATOR_FIELD_MANAGER, RLJOB_CACHE
from rljob_api.errors import SpecError

from .api_errors import ChildWriteError, Trouble, describe, trouble
from .applied import AppliedChildren
from .build import (
    BuildSettings,
    build_conversion_rayjob,
    build_prerequisites,
    build_rayjob,
    prerequisite_waves,
)
from .checks import (
    Blocker,
    check_children_fit,
    check_host_paths,
    check_nodes,
    check_references,
    claims_needed,
    secrets_needed,
)
from .conversions import (
    FAILED,
    MEGATRON,
    RUNNING,
    SUCCEEDED,
    Wanted,
    entries,
    export_conversion,
    export_steps,
    megatron_conversion,
    needs_megatron_checkpoint,
    state_of,
    training_succeeded,
)
from .conversions import events as conversion_events
from .job import Job, JobKey, SpecCache, job_from_object
from .kube import Kube
from .kueue import kueue_admits
from .metrics import Metrics
from .names import (
    KUEUE_GATE_MANAGER,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    rayjob_name,
)
from .own_writes import Cause, OwnWrites
from .permissions import describe_api_error
from .plan import plan
from .pod_fields import volume_fields
from .pod_states import classify, node_trouble
from .quota import Decision, charged_gpus, decide, demands, quotas_of
from .restarts import Failure, is_recorded, recreating
from .status import (
    Observed,
    announcement,
    compute_status,
    error_status,
    holds_pods,
    restart_status,
    status_changed,
)
from .watch_cache import slim_job

log = logging.getLogger("rljob.operator")

EventSink = Callable[[dict[str, Any], str, str, str], None]
BACKOFF_SECONDS = (1, 2, 5, 10, 30, 60)
# Passes run at most this many at a time, in the order they were asked for, the others waiting (and
# folding the events of their job that arrive meanwhile). Unbounded, a burst of a thousand new jobs ran
# a thousand passes at once: each of their API calls queued behind every other pass's, so every job
# got its RayJob near the end of the burst (and the responses in flight took hundreds of MiB).
FOREGROUND_PASSES = 64
# Passes for events of a job's RayJob and pods take turns of their own, this many at a time: in a burst
# of new jobs the first passes (job events) never wait behind a pass per status write KubeRay makes.
BACKGROUND_PASSES = 4


async def all_of(*steps: Awaitable[Any]) -> list[Any]:
    """Run independent API calls at once; wait for every one, then raise the first failure."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _replaced(read: Mapping[str, Any] | None, applied: Mapping[str, Any]) -> bool:
    """The apply returned another object than the one this pass read: the read one was gone."""
    if read is None or read is applied:
        return False
    return (read.get("metadata") or {}).get("uid") != (applied.get("metadata") or {}).get("uid")


def others_part(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a job is not the operator's: its metadata (less what every write changes), its spec and
    the runtime's status.progress. The rest of status is the operator's."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return meta, obj.get("spec"), (obj.get("status") or {}).get("progress")


@dataclass
class Conversions:
    """The conversions one pass needs, and the RayJobs it saw of them (by name)."""

    wanted: list[Wanted] = field(default_factory=list)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)

    def running_before_training(self) -> dict[str, Any] | None:
        """The RayJob of the MegatronCheckpoint conversion this pass saw running, if any."""
        for want in self.wanted:
            rayjob = self.seen.get(want.name)
            if want.kind == MEGATRON and rayjob is not None and state_of(rayjob)[0] == RUNNING:
                return rayjob
        return None


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: BuildSettings,
        metrics: Metrics,
        emit: EventSink,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.emit = emit
        self.clock = clock  # the time status and the startup timeout are computed at
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._failures: dict[tuple[str, str], int] = {}
        self._retries: dict[tuple[str, str], asyncio.TimerHandle] = {}
        # Jobs with a pass waiting for their lock (and, for a background one, for its turn): the events
        # of a job that arrive meanwhile fold into that waiting pass (a workqueue's de-duplication).
        # Keyed by job and background or not; each waits with the causes folded into it.
        self._waiting: dict[tuple[JobKey, bool], list[Cause]] = {}
        self._turns = {
            False: asyncio.Semaphore(FOREGROUND_PASSES),
            True: asyncio.Semaphore(BACKGROUND_PASSES),
        }
        # Our writes whose watch events have not come back (see _write_status, _own_rayjob): their
        # events start no pass, and till they come a pass reads the job or RayJob from the API server.
        self.own = OwnWrites()
        self._specs = SpecCache()
        # Read from the /metrics thread: set(dict) copies in one C call under the GIL.
        self._applied = AppliedChildren()
        metrics.track(
            lambda: (
                set(self._locks)
                | set(self._failures)
                | set(self._retries)
                | self.own.keys()
                | self._applied.jobs()
                | self._specs.jobs()
            )
        )

    async def reconcile(
        self,
        namespace: str,
        name: str,
        version: str | None = None,
        *,
        rayjob: tuple[str, str] | None = None,
        background: bool = False,
    ) -> None:
        """A pass over the job, unless one already waits for it. `version`: the resourceVersion of the
        job event that calls for it; when that is the job as our own status write left it, the pass would
        find nothing new and is skipped. `rayjob`: (name, resourceVersion) of the RayJob event that calls
        for it, skipped the same way when that is the RayJob as our own apply returned it. Anything else
        (an event of its pods, a retry, the resync) always runs a pass. `background`: an event of the
        job's children: such passes take turns of their own, BACKGROUND_PASSES at a time (the others
        FOREGROUND_PASSES at a time)."""
        key = (namespace, name)
        if version is not None:
            self.own.job_event(key, version)  # the cache has caught up with our last write?
        cause: Cause = ("job", version) if version else ("RayJob", *rayjob) if rayjob else None
        if self.own.echo(key, cause):
            return
        # That pass starts later and reads all this one would (a workqueue's de-duplication); a job
        # event never waits behind a background pass's turn.
        for slot in ((key, False), (key, True)) if background else ((key, False),):
            waiting = self._waiting.get(slot)
            if waiting is not None:
                waiting.append(cause)
                return
        lock = self._locks.setdefault(key, asyncio.Lock())
        slot, turn = (key, background), self._turns[background]
        causes = self._waiting[slot] = [cause]
        asked = time.perf_counter()
        try:
            await turn.acquire()
            try:
                await lock.acquire()
            except BaseException:
                turn.release()
                raise
        finally:
            self._waiting.pop(slot, None)
        self.metrics.pass_wait.observe(time.perf_counter() - asked)
        try:
            # Again: the event of a write can come before the pass that wrote has its answer.
            if all(self.own.echo(key, c) for c in causes):
                return
            await self._pass(key)
        finally:
            lock.release()
            turn.release()

    def rayjob_seen(self, namespace: str, name: str, uid: str) -> None:
        """A watch event of this RayJob arrived, and kopf updated the index before it called the
        handler: the index knows the RayJob (or that it is gone) from here on. Any event of the RayJob
        the operator wrote will do, not only that of its write: what a pass needs from the index is
        whether the RayJob exists; a version older than the write only makes the next pass apply
        again. An event of another RayJob of that name (one deleted for a restart) does not."""
        self.own.rayjob_seen(namespace, name, uid)

    def _rayjob_written(self, namespace: str, written: Mapping[str, Any]) -> None:
        """The operator applied this RayJob: till a watch event of it arrives, passes read it from the
        API server, unless the event has come already (before the write's answer)."""
        meta = written.get("metadata") or {}
        if not meta.get("name") or not meta.get("uid"):
            return
        known, cached = self.kube.cached_rayjob(namespace, meta["name"])
        version = ((cached or {}).get("metadata") or {}).get("resourceVersion")
        if not known or version is None or version != meta.get("resourceVersion"):
            self.own.rayjob_written(namespace, meta["name"], meta["uid"])

    async def _write_status(self, obj: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Patch the job's /status. When the object the API server returns differs from the one this
        pass read only in the operator's own status, its watch event brings nothing new: its
        resourceVersion is remembered so that event starts no pass (each status write cost a pass that
        wrote nothing). Anyone else's write in between (a spec edit, the runtime's progress) makes it
        differ, and the event runs a pass as before: that write's own event may be lost (a watch
        re-listed after an error shows only the latest version)."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        written = await self.kube.apply_job_status(*key, status)
        version = (written.get("metadata") or {}).get("resourceVersion")
        if version and version != obj["metadata"].get("resourceVersion"):
            self.own.job_written(key, version)
        # Compared as the cache keeps them (the pass may have read the job from it), on the fields a
        # pass reads.
        if version and others_part(slim_job(written)) == others_part(slim_job(obj)):
            self.own.ours(key, ("job", version))

    def _own_rayjob(self, job: Job, rayjob: Mapping[str, Any]) -> None:
        """The RayJob this pass applied and computed the status from: the watch event of that version
        brings nothing new, so it starts no pass (it used to cost one per created job). KubeRay's writes
        after it are versions of their own, and run passes."""
        meta = rayjob.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.own.ours((job.namespace, job.name), ("RayJob", meta["name"], meta["resourceVersion"]))

    async def _pass(self, key: tuple[str, str]) -> None:
        """One pass with its outcome: counted, and retried with backoff after a failure."""
        namespace, name = key
        started = time.perf_counter()
        try:
            await self._reconcile(namespace, name)
        except Exception as exc:  # retried with backoff; never crash the operator
            if await self._deleted_meanwhile(namespace, name):
                self.forget(key)  # a 404 on a write of a job deleted mid-pass: nothing to retry
                return
            self.metrics.reconciles.labels(result="error").inc()
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1]
            log.warning(
                "reconcile %s/%s failed (attempt %d), retrying in %ss: %s",
                namespace,
                name,
                failures,
                delay,
                describe(exc),
            )
            shown = trouble(exc, failures, delay)
            if shown is not None:
                await self._report_trouble(namespace, name, shown)
            self._retry_later(key, delay)
        else:
            self.metrics.reconciles.labels(result="ok").inc()
            self._failures.pop(key, None)
            retry = self._retries.pop(key, None)
            if retry is not None:
                retry.cancel()  # this pass did what the retry was for
        finally:
            self.metrics.duration.observe(time.perf_counter() - started)

    async def _deleted_meanwhile(self, namespace: str, name: str) -> bool:
        try:
            obj = await self.kube.get_job(namespace, name)
        except Exception:
            return False  # the failure stands as it is
        return obj is None or bool(obj["metadata"].get("deletionTimestamp"))

    def _retry_later(self, key: tuple[str, str], delay: float) -> None:
        if key in self._retries:
            self._retries[key].cancel()
        loop = asyncio.get_running_loop()
        self._retries[key] = loop.call_later(delay, lambda: asyncio.ensure_future(self.reconcile(*key)))

    async def _read_job(self, key: JobKey) -> dict[str, Any] | None:
        """The job from the watch cache (its event started this pass, or the cache is as new as our last
        write), else from the API server: while the event of our last status write has not arrived, and
        before the caches are handed over. A job the cache does not have is gone: every pass for a job
        comes after its first event (kopf indexes before it calls the handlers), so a pass for one that
        is not there was asked for by its deletion or by an event of its children after it (garbage
        collection deleting them: a GET each, thousands when many jobs go at once)."""
        if not self.own.job_behind(key):
            known, cached = self.kube.cached_job(*key)
            if known:
                return cached
        return await self.kube.get_job(*key)

    async def _read_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job's RayJob from the watch cache (kopf's index: the event that started this pass is in
        it), else from the API server: before the caches are handed over, and while a RayJob the
        operator applied or deleted has not come back through the watch."""
        if not self.own.rayjob_behind(namespace, name):
            known, cached = self.kube.cached_rayjob(namespace, name)
            if known:
                return cached
        return await self.kube.get_rayjob(namespace, name)

    async def _reconcile(self, namespace: str, name: str) -> None:
        obj = await self._read_job((namespace, name))
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            self.forget((namespace, name))  # children go by garbage collection
            return
        try:
            job = job_from_object(obj, self._specs)
        except SpecError as exc:
            self.emit(obj, "Warning", "InvalidSpec", str(exc))
            return
        now = self.clock()
        planned = plan(job, await self._read_rayjob(namespace, rayjob_name(name)))
        if planned.restart is not None and planned.rayjob is not None:
            job, rayjob = await self._restart(obj, job, planned.rayjob, planned.restart, now)
            planned = plan(job, rayjob)  # the failed RayJob may be gone already: its successor is due
        rayjob, leftover, blocker = planned.rayjob, planned.leftover, planned.blocker
        queue: Decision | None = None
        conversions = Conversions()
        if planned.apply:
            running = rayjob is not None and not (rayjob.get("spec") or {}).get("suspend")
            if not running:
                blocker = await self._preflight(job)
            if blocker is None:
                create, suspend, queue = await self._admission(job, rayjob)
                if create:
                    new = rayjob is None and not job.status.get("phase")
                    # At once: a new job's Pending status and the prerequisites (they run nothing;
                    # the RoleBinding after its Role); its RayJob after all.
                    done = await all_of(
                        *([self._record_pending(obj, job, Observed(now, None, None, queue))] if new else []),
                        self._apply_prerequisites(job),
                    )
                    if new:
                        job = done[0]
                    if rayjob is None and needs_megatron_checkpoint(job) and not job.spec.suspend:
                        # Training starts from the model cache's Megatron checkpoint: made first.
                        want = megatron_conversion(job, RLJOB_CACHE)
                        create = await self._conversion(job, want, conversions) == SUCCEEDED
                if create:
                    created = rayjob is None
                    if created and suspend is None:
                        # Kueue's (_admission): born suspended under a manager of its own, which
                        # Kueue's admission replaces.
                        rayjob = await self._apply_child(
                            job, build_rayjob(job, self.settings, suspend=True), manager=KUEUE_GATE_MANAGER
                        )
                        self._announce_created(obj, job, rayjob)  # announced even if the next apply fails
                    applied = await self._apply_child(
                        job, build_rayjob(job, self.settings, suspend=suspend), current=rayjob
                    )
                    if (created and rayjob is None) or _replaced(rayjob, applied):
                        # A RayJob deleted by hand between this pass's read and its apply: the
                        # server-side apply created it again.
                        self._announce_created(obj, job, applied)
                    if applied is not rayjob:
                        self._own_rayjob(job, applied)
                    rayjob = applied
        if planned.export and blocker is None:  # not while a pre-flight check stops the job
            for step in export_steps(job, training_succeeded(job, rayjob)):
                await self._conversion(job, export_conversion(job, step), conversions)
        pods = None
        if (
            rayjob is not None
            and not planned.replacing
            and job.status.get("phase") in ("Starting", "Pending", None)
        ):
            # Read only while starting: why its pods do not run (a running job's pass lists nothing).
            pods = classify(
                await self.kube.list_pods(namespace, f"{LABEL_JOB}={name}"),
                rayjob,
                namespace,
                volume_fields(job.spec),
            )
        elif rayjob is None and (converting := conversions.running_before_training()) is not None:
            # The same for the conversion's pod: an unbound model cache claim, a failing image pull.
            pods = classify(
                await self.kube.list_pods(namespace, f"{LABEL_JOB}={name}"), converting, namespace
            )
        nodes = None
        running = rayjob is not None and job.status.get("phase") == "Running"
        # A running job's pods on a node that stopped being Ready (nodes and pods from the watch
        # caches: a pass while every node is Ready lists no pod).
        if running and (down := await self.kube.nodes_not_ready()):
            nodes = node_trouble(await self.kube.list_pods(namespace, f"{LABEL_JOB}={name}"), down, namespace)
        seen = Observed(
            now,
            rayjob,
            blocker,
            queue,
            pods,
            leftover,
            tuple(conversions.wanted),
            conversions.seen,
            nodes=nodes,
        )
        status = compute_status(job, seen)
        if status_changed(job.status, status):
            await self._write_status(obj, status)
            self._announce(obj, job, status)
            for event in conversion_events(job.status, status.get("conversions") or []):
                self.emit(obj, *event)
        if holds_pods(status, rayjob):  # failed by its startup timeout: free the quota its pods hold
            await self._apply_child(job, build_rayjob(job, self.settings, suspend=True), current=rayjob)
        self.metrics.observe((namespace, name), {**job.status, **status})  # progress is the runtime's

    async def _restart(
        self, obj: dict[str, Any], job: Job, rayjob: dict[str, Any], failure: Failure, now: datetime
    ) -> tuple[Job, dict[str, Any] | None]:
        """A whole-job restart after a retriable failure: record it in status (once per failed
        RayJob, keyed by its uid), then delete the failed RayJob (KubeRay deletes its Ray cluster).
        Returns the job with that status and the RayJob as it is now: None when already gone (the
        caller creates the next one), else the failed one, being deleted."""
        if not is_recorded(job.status, failure.uid):
            status = restart_status(job, failure, rayjob, now)
            await self._write_status(obj, status)
            self._announce(obj, job, status)
            log.info(
                "restarting %s/%s (restart %d of %d): RayJob %s failed: %s: %s",
                job.namespace,
                job.name,
                status["restarts"],
                job.spec.fault_tolerance.backoff_limit,
                failure.uid,
                failure.reason,
                failure.line,
            )
            progress = {"progress": job.status["progress"]} if job.status.get("progress") else {}
            job = dataclasses.replace(job, status={**status, **progress})  # progress: the runtime's
        if rayjob["metadata"].get("deletionTimestamp"):
            return job, rayjob  # deleted by an earlier pass: still going
        await self.kube.delete_rayjob(job.namespace, rayjob["metadata"]["name"], failure.uid)
        self.own.rayjob_written(
            job.namespace, rayjob["metadata"]["name"], failure.uid
        )  # its event: on the way
        return job, await self.kube.get_rayjob(job.namespace, rayjob["metadata"]["name"])

    async def _conversion(self, job: Job, want: Wanted, conversions: Conversions) -> str:
        """Run one conversion if it needs to: look up its RayJob, create it when missing (unless it
        succeeded before, or failed and its RayJob is still there for a person to read and delete).
        Returns its state (Running, Succeeded, Failed)."""
        conversions.wanted.append(want)
        entry = entries(job.status).get(want.name)
        if entry is not None and entry["state"] == SUCCEEDED:
            return SUCCEEDED
        rayjob = await self.kube.get_rayjob(job.namespace, want.name)
        if rayjob is not None and not job.owns(rayjob):
            return "Running"  # an earlier job's of this name, going by garbage collection
        if rayjob is not None and entry is not None and entry["state"] == FAILED:
            return FAILED  # kept for a person: deleting it asks for another try
        if rayjob is None:
            await self._apply_prerequisites(job)  # its pod's service account
            rayjob = await self._apply_child(job, build_conversion_rayjob(job, self.settings, want))
        conversions.seen[want.name] = rayjob
        return state_of(rayjob)[0]

    async def _apply_prerequisites(self, job: Job) -> None:
        """The runtime's identity and the NetworkPolicy, each wave at once (prerequisite_waves)."""
        for wave in prerequisite_waves(build_prerequisites(job, self.settings)):
            await all_of(*(self._apply_child(job, c, read=False) for c in wave))

    def _announce_created(self, obj: dict[str, Any], job: Job, rayjob: dict[str, Any]) -> None:
        name, gpus = rayjob["metadata"]["name"], job.spec.total_gpus()
        if recreating(job.status):
            self.emit(
                obj,
                "Warning",
                "Recreated",
                f"RayJob {name} was deleted, not by this operator; recreated it ({gpus} GPUs). Its Ray job "
                "starts again (from the latest checkpoint, if checkpoint.resume allows). To stop the job, "
                "delete the RLTrainingJob or set spec.suspend: true",
            )
            return
        self.emit(obj, "Normal", "Created", f"created RayJob {name} ({gpus} GPUs)")

    def reapply_all(self, present: Collection[JobKey] | None = None) -> None:
        """The next pass of each job applies its children again, changed or not (the resync pass:
        restores a child deleted or edited by hand). `present`: the jobs the resync listed; what is kept
        of any other is dropped."""
        self._applied.forget_all()
        if present is not None:
            self._specs.keep_only(present)
            self.own.drop_stale_rayjob_marks()

    def forget(self, key: tuple[str, str]) -> None:
        """A deleted job leaves no per-job state behind (locks, failure counts, pending retries,
        metrics)."""
        self.metrics.forget(key)
        self._applied.forget(key)
        self._specs.forget(key)
        self.own.forget_job(key)
        self._locks.pop(key, None)
        self._failures.pop(key, None)
        retry = self._retries.pop(key, None)
        if retry is not None:
            retry.cancel()

    async def _apply_child(
        self,
        job: Job,
        child: dict[str, Any],
        *,
        current: dict[str, Any] | None = None,
        read: bool = True,
        manager: str = OPERATOR_FIELD_MANAGER,
    ) -> dict[str, Any]:
        """Server-side apply of one child, unless this body was applied before and nothing since calls
        for it (applied.py: `current` is the object as read this pass, None when missing; `read=False`
        for a child never read). Returns the applied object, or `current` when skipped. A failure
        names the child (api_errors decides whether a retry can help)."""
        key, slot = (job.namespace, job.name), (child["kind"], child["metadata"]["name"], manager)
        if self._applied.unchanged(key, slot, child, current, read=read):
            return current or {}
        try:
            result = await self.kube.apply(child, manager=manager)
        except Exception as exc:
            raise ChildWriteError(child["kind"], child["metadata"]["name"], exc) from exc
        self._applied.record(key, slot, child, result)
        if child["kind"] == "RayJob" and child["metadata"]["name"] == rayjob_name(job.name):
            self._rayjob_written(job.namespace, result)
        return result

    async def _report_trouble(self, namespace: str, name: str, shown: Trouble) -> None:
        """A failed pass on the job: a refusal (a permission the operator lacks, a child the API server
        refuses) as Stalled=True, a repeated transient error as Reconciling=True/Retrying with the
        attempt; in the log, in an event (once per new reason) and in the job's status. Each best
        effort: the missing rule may be the one these need."""
        if shown.stalled:  # a retry is logged by reconcile() already
            log.error("%s while reconciling %s/%s: %s", shown.reason, namespace, name, shown.message)
        try:
            obj = await self.kube.get_job(namespace, name)
            if obj is None:
                return
            job = job_from_object(obj, self._specs)
            status = error_status(job, shown.reason, shown.message, self.clock(), stalled=shown.stalled)
            if not status_changed(job.status, status):
                return  # once per refusal, not at every retry
            kind = "Stalled" if shown.stalled else "Reconciling"
            conditions = job.status.get("conditions") or []
            old: dict[str, Any] = next((c for c in conditions if c.get("type") == kind), {})
            if shown.stalled or old.get("reason") != shown.reason:
                self.emit(obj, "Warning", shown.reason, shown.message)
            await self._write_status(obj, status)
        except Exception as exc:
            log.error("cannot report %s on %s/%s: %s", shown.reason, namespace, name, describe_api_error(exc))

    async def _record_pending(self, obj: dict[str, Any], job: Job, observed: Observed) -> Job:
        """A new job is Pending before its RayJob exists: watchers (kubectl get -w, kstatus, GitOps
        tools) see it accepted even when creating it takes a while or fails."""
        pending = compute_status(job, observed)
        await self._write_status(obj, pending)
        self._announce(obj, job, pending)
        return dataclasses.replace(job, status=pending)

    async def _preflight(self, job: Job) -> Blocker | None:
        blocker = (
            check_children_fit(job, build_rayjob(job, self.settings, suspend=None))
            or check_host_paths(job, self.settings.allowed_host_paths)
            or check_nodes(job, await self.kube.list_nodes())
        )
        if blocker is not None:
            return blocker
        secrets = None
        if self.settings.secret_preflight:  # only where the install grants `get secrets`
            wanted = {name for _, name in secrets_needed(job)}
            secrets = {s for s in wanted if await self.kube.exists(job.namespace, "secrets", s)}
        claims = {
            name
            for name in {name for _, name in claims_needed(job)}
            if await self.kube.exists(job.namespace, "persistentvolumeclaims", name)
        }
        return check_references(job, secrets, claims)

    async def _admission(
        self, job: Job, rayjob: dict[str, Any] | None
    ) -> tuple[bool, bool | None, Decision | None]:
        """(create or update the RayJob?, the suspend value to apply (None: leave it to Kueue),
        the quota decision if one was made)."""
        exists = rayjob is not None
        if job.spec.suspend:
            return exists, True, None
        if kueue_admits(job, self.settings.kueue_manage_jobs_without_queue_name):
            return True, None, None  # Kueue decides when it runs
        if rayjob is not None and not (rayjob.get("spec") or {}).get("suspend"):
            return True, False, None  # already admitted: never re-queued
        decision = await self._quota(job)
        if decision.admitted:
            return True, False, decision
        return exists, True, decision

    async def _quota(self, job: Job) -> Decision:
        """Reads the namespace (quotas, RayJobs, pods, jobs); quota.py counts and decides."""
        resource = job.spec.resources.gpu_resource_name
        quotas = quotas_of(await self.kube.list_quotas(job.namespace), resource)
        if not quotas:
            return Decision(True)
        rayjobs = await self.kube.list_rayjobs(job.namespace, f"{LABEL_MANAGED_BY}={MANAGED_BY}")
        charged = charged_gpus(await self.kube.list_pods(job.namespace, LABEL_JOB), resource)
        jobs = []
        for other in await self.kube.list_jobs(job.namespace):
            try:
                jobs.append(job_from_object(other, self._specs))
            except SpecError:
                continue
        return decide(job.name, demands(job, jobs, rayjobs, charged, self.clock()), quotas, resource)

    def _announce(self, obj: dict[str, Any], job: Job, status: dict[str, Any]) -> None:
        event = announcement(job.status, status)
        if event is not None:
            self.emit(obj, *event)
