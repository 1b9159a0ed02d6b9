"""Leader election: only the replica that holds the Lease runs the operator (rljob-operator --leader-elect).

The lease is kept by a thread of its own, with its own event loop and API client (`Elector`), so the
work of the operator's loop (a burst of jobs, a long pass) never delays a renewal, as client-go's
goroutine is never delayed by a busy controller. Until it leads, a replica runs nothing of the
operator: no watch, no handler, no write; it only reads the Lease every retry period and answers the
liveness probe (/healthz on the --liveness address, which kopf serves once the replica leads). When
it takes the lease, the thread hands the port over and `wait_for_leadership()` returns; the caller
then runs the operator. If a renewal fails for the renew deadline, or the lease turns out to be held
by another replica, the process exits at once (status 1, as controller-runtime's managers do), with
whatever passes it had in flight: the lease lasts longer than the renew deadline, so it is gone before
another replica may take over, and the restarted container waits for the lease like any other
replica. A leader stopped by SIGTERM releases the lease once the operator has stopped (`stop()`), so
the next replica takes over at its next try instead of after the lease's duration.

The decisions are leader.py's (pure); this module is the Lease's API calls, the timing and the thread.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Gauge

from .kube import Kube, load_config, without_env_lookups
from .leader import JITTER, Record, Timing, lease_body, next_step, observe, record_of, released, renewed
from .permissions import describe_api_error

log = logging.getLogger("rljob.operator")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LOST_EXIT_STATUS = 1
RELEASE_TIMEOUT_S = 5.0

LEADER = Gauge(
    "rljob_operator_leader",
    "1 while this replica runs the operator: it holds the leader Lease, or leader election is off.",
)


@dataclass(frozen=True)
class Election:
    """Which Lease, who this replica is, and the timing."""

    namespace: str
    name: str
    identity: str
    timing: Timing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("leader election (for more than one replica)")
    group.add_argument(
        "--leader-elect",
        action="store_true",
        help="run the operator only while holding a coordination.k8s.io Lease; the other replicas wait",
    )
    group.add_argument(
        "--leader-election-namespace",
        default=None,
        help="namespace of the Lease (default: the pod's own, from its ServiceAccount)",
    )
    group.add_argument("--leader-election-name", default="rljob-operator", help="name of the Lease")
    defaults = Timing()
    group.add_argument(
        "--leader-election-lease-duration",
        type=float,
        default=defaults.lease_duration,
        metavar="SECONDS",
        help=f"another replica takes over a lease not renewed for this long (default {defaults.lease_duration:g})",
    )
    group.add_argument(
        "--leader-election-renew-deadline",
        type=float,
        default=defaults.renew_deadline,
        metavar="SECONDS",
        help=f"the leader exits when it could not renew for this long (default {defaults.renew_deadline:g})",
    )
    group.add_argument(
        "--leader-election-retry-period",
        type=float,
        default=defaults.retry_period,
        metavar="SECONDS",
        help=f"the leader renews, and the others try, this often (default {defaults.retry_period:g})",
    )


def election_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Election | None:
    """The election the flags ask for, None without --leader-elect; bad flags end in parser.error."""
    if not args.leader_elect:
        return None
    timing = Timing(
        args.leader_election_lease_duration,
        args.leader_election_renew_deadline,
        args.leader_election_retry_period,
    )
    problems = timing.problems()
    if problems:
        parser.error("leader election: " + "; ".join(problems))
    namespace = args.leader_election_namespace
    if namespace is None:
        try:
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        except OSError:
            parser.error("--leader-elect needs --leader-election-namespace outside a pod")
    # The pod's name (its hostname) for people, a uuid so that a restarted container is a new holder.
    identity = f"{socket.gethostname()}_{uuid.uuid4()}"
    return Election(namespace, args.leader_election_name, identity, timing)


class LeaseApi(Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def create_lease(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_lease(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def close(self) -> None: ...


class LeaseKube(Kube):
    """The Lease's API calls, plain dicts in and out as everywhere in the operator (kube.py)."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self.coordination = client.CoordinationV1Api(api)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_or_none(self.coordination.read_namespaced_lease, name, namespace)

    async def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call(
            self.coordination.create_namespaced_lease, body["metadata"]["namespace"], body
        )

    async def replace_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        return await self._call(
            self.coordination.replace_namespaced_lease, meta["name"], meta["namespace"], body
        )


def _now() -> datetime:
    return datetime.now(UTC)


async def connect() -> LeaseApi:
    """A client of its own (the elector's loop is not the operator's), with the operator's credentials."""
    await load_config()
    api = client.ApiClient()
    without_env_lookups(api)
    return LeaseKube(api)


class LeadershipLost(Exception):
    pass


class Elector:
    """Campaigns for the lease in a thread of its own and, once leading, keeps it or ends the process."""

    def __init__(
        self,
        election: Election,
        liveness: str | None = None,
        *,
        lease_api: Callable[[], Awaitable[LeaseApi]] = connect,
        exit_process: Callable[[], None] | None = None,
    ) -> None:
        """`liveness`: kopf's liveness URL; a waiting replica answers it itself. `exit_process`: how the
        process ends when leadership is lost (os._exit; tests pass their own)."""
        self.election = election
        self.liveness = liveness
        self._lease_api = lease_api
        self._exit = exit_process or _exit
        self._leading = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="leader-election", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._lease: dict[str, Any] | None = None  # the Lease as this replica last wrote it
        self._deadline = 0.0  # monotonic: give up leading when not renewed by then
        self.failed: BaseException | None = None

    # ------------------------------------------------------------------------- the caller's side

    def start(self) -> None:
        LEADER.set(0)
        self._thread.start()

    def wait_for_leadership(self) -> None:
        """Block until this replica leads."""
        while not self._leading.wait(1.0):
            if not self._thread.is_alive():
                raise RuntimeError(f"leader election stopped: {self.failed}")

    def stop(self) -> None:
        """Release the lease (if held) and end the thread: the operator has stopped."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
            self._thread.join(RELEASE_TIMEOUT_S + 1)

    # ------------------------------------------------------------------------- the thread

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # never a silent standby that can no longer lead
            self.failed = exc
            log.critical("leader election failed: %s", describe_api_error(exc), exc_info=exc)
            self._exit()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        kube = await self._lease_api()
        try:
            health = await serve_health(self.liveness, self.election.identity) if self.liveness else None
            try:
                if not await self._campaign(kube):
                    return  # stopped while waiting
            finally:
                if health is not None:
                    await health.cleanup()  # kopf serves the probe from now on
            LEADER.set(1)
            self._leading.set()
            try:
                await self._keep(kube)
            except LeadershipLost as lost:
                log.critical(
                    "lost the leader lease %s/%s: %s; exiting so that no two replicas reconcile the same jobs",
                    self.election.namespace,
                    self.election.name,
                    lost,
                )
                self._exit()
                return
            await self._release(kube)
        finally:
            await kube.close()

    async def _campaign(self, kube: LeaseApi) -> bool:
        """Try every retry period until this replica holds the lease (True) or is stopped (False)."""
        e, seen, said, error = self.election, None, "", ""
        log.info("waiting for the leader lease %s/%s as %s", e.namespace, e.name, e.identity)
        while True:
            try:
                current = await kube.get_lease(e.namespace, e.name)
                seen = observe(seen, record_of(current), time.monotonic())
                step = next_step(seen, e.identity, time.monotonic(), _now(), e.timing)
                if step.action == "wait":
                    holder = seen.record.holder if seen.record else ""
                    if holder != said:  # once per holder, not every second
                        log.info("leader lease %s/%s is %s", e.namespace, e.name, step.why)
                        said = holder
                else:
                    assert step.record is not None
                    await self._write(kube, step.action, step.record, current)
                    log.info("leading: took the lease %s/%s (%s)", e.namespace, e.name, step.why)
                    return True
            except (ApiException, TimeoutError, OSError) as exc:
                # A conflict: another replica wrote first, read it again. Anything else is said once,
                # not at every try.
                if not (isinstance(exc, ApiException) and exc.status == 409):
                    message = describe_api_error(exc)
                    (log.warning if message != error else log.debug)("leader election: %s", message)
                    error = message
            if await self._stopped_within(e.timing.retry_period * random.uniform(1.0, JITTER)):
                return False

    async def _write(
        self, kube: LeaseApi, action: str, record: Record, current: dict[str, Any] | None
    ) -> None:
        """Create or replace the lease with `record`; on success, lead until the renew deadline counted
        from when the write was sent (the lease's clock started no earlier)."""
        e = self.election
        version = ((current or {}).get("metadata") or {}).get("resourceVersion")
        body = lease_body(e.namespace, e.name, record, version)
        sent = time.monotonic()
        write = kube.create_lease(body) if action == "create" else kube.replace_lease(body)
        self._lease = await asyncio.wait_for(write, e.timing.renew_deadline)
        self._deadline = sent + e.timing.renew_deadline

    async def _keep(self, kube: LeaseApi) -> None:
        """Renew every retry period until stopped; LeadershipLost when that cannot go on."""
        e = self.election
        while True:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise LeadershipLost(f"not renewed for {e.timing.renew_deadline:g} s")
            if await self._stopped_within(min(e.timing.retry_period, left)):
                return
            try:
                await asyncio.wait_for(self._renew(kube), max(0.0, self._deadline - time.monotonic()))
            except TimeoutError:
                continue  # the deadline passed: said at the top of the loop
            except (ApiException, OSError) as exc:  # tried again till the deadline
                log.warning("cannot renew the leader lease: %s", describe_api_error(exc))

    async def _renew(self, kube: LeaseApi) -> None:
        e = self.election
        try:
            await self._write(kube, "update", self._renewed(), self._lease)
        except ApiException as exc:
            if exc.status == 404:  # deleted: another replica may create it at once
                raise LeadershipLost("the lease was deleted") from exc
            if exc.status != 409:
                raise
            # Someone wrote the lease since: read who holds it now.
            current = await kube.get_lease(e.namespace, e.name)
            record = record_of(current)
            if record is None or record.holder != e.identity:
                holder = record.holder if record else "nobody (deleted)"
                raise LeadershipLost(f"the lease is now held by {holder or 'nobody'}") from exc
            self._lease = current  # our own write whose answer was lost: renew from it next time

    def _renewed(self) -> Record:
        record = record_of(self._lease)
        assert record is not None and record.holder == self.election.identity
        return renewed(record, _now(), self.election.timing)

    async def _release(self, kube: LeaseApi) -> None:
        """Hand the lease back: the next replica takes it at its next try."""
        e = self.election
        record = record_of(self._lease)
        if record is None or record.holder != e.identity or time.monotonic() > self._deadline:
            return
        body = lease_body(e.namespace, e.name, released(record, _now()), self._lease_version())
        try:
            await asyncio.wait_for(kube.replace_lease(body), RELEASE_TIMEOUT_S)
            LEADER.set(0)
            log.info("released the leader lease %s/%s", e.namespace, e.name)
        except Exception as exc:  # it expires by itself
            log.warning("cannot release the leader lease: %s", describe_api_error(exc))

    def _lease_version(self) -> str | None:
        return ((self._lease or {}).get("metadata") or {}).get("resourceVersion")

    async def _stopped_within(self, seconds: float) -> bool:
        assert self._stop is not None
        try:
            await asyncio.wait_for(self._stop.wait(), max(0.0, seconds))
        except TimeoutError:
            return False
        return True


async def serve_health(url: str, identity: str) -> Any:
    """Answer the liveness probe while waiting for the lease (kopf answers it once the replica leads).
    Returns the aiohttp runner; its cleanup frees the port."""
    from aiohttp import web

    parts = urllib.parse.urlsplit(url)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"leader": False, "identity": identity})

    app = web.Application()
    app.router.add_get(parts.path or "/", healthz)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname, parts.port or 80, reuse_address=True).start()
    return runner


def _exit() -> None:
    """End the process now: no handler, no cleanup (they could write as a leader that is not one)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(LOST_EXIT_STATUS)
