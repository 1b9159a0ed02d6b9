"""election.py: replicas electing one leader through a Lease store that checks resourceVersions as
the API server does (a write of an outdated version is a 409), with short timings. Each Elector runs
in its own thread, as in the operator."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from rljob_operator.election import Election, Elector, LeaseApi
from rljob_operator.leader import Timing, record_of

TIMING = Timing(lease_duration=1, renew_deadline=0.6, retry_period=0.05)


class Leases:
    """One Lease, as the API server keeps it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.failing: set[str] = set()  # identities whose calls fail (500)

    def write(self, body: dict[str, Any], create: bool) -> dict[str, Any]:
        with self.lock:
            if create and self.obj is not None:
                raise ApiException(status=409, reason="AlreadyExists")
            if not create:
                if self.obj is None:
                    raise ApiException(status=404, reason="NotFound")
                if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
                    raise ApiException(status=409, reason="Conflict")
            self.version += 1
            self.obj = json.loads(json.dumps(body))
            self.obj["metadata"]["resourceVersion"] = str(self.version)
            return json.loads(json.dumps(self.obj))

    def holder(self) -> str:
        record = record_of(self.obj)
        return record.holder if record else ""


class Client(LeaseApi):
    def __init__(self, leases: Leases, identity: str) -> None:
        self.leases, self.identity = leases, identity

    def _check(self) -> None:
        if self.identity in self.leases.failing:
            raise ApiException(status=500, reason="InternalError")

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        with self.leases.lock:
            return json.loads(json.dumps(self.leases.obj)) if self.leases.obj else None

    async def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check()
        return self.leases.write(body, create=True)

    async def replace_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check()
        return self.leases.write(body, create=False)

    async def close(self) -> None:
        pass


class Replica:
    def __init__(self, leases: Leases, identity: str, liveness: str | None = None) -> None:
        self.exited_at: float | None = None

        async def connect() -> LeaseApi:
            return Client(leases, identity)

        def exit_process() -> None:
            self.exited_at = time.monotonic()

        election = Election("ops", "rljob-leader", identity, TIMING)
        self.elector = Elector(election, liveness, lease_api=connect, exit_process=exit_process)
        self.led_at: float | None = None
        self.elector.start()
        threading.Thread(target=self._lead, daemon=True).start()

    def _lead(self) -> None:
        try:
            self.elector.wait_for_leadership()
        except RuntimeError:
            return
        self.led_at = time.monotonic()


def until(check: Any, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return time.monotonic()


@pytest.fixture
def leases() -> Iterator[Leases]:
    yield Leases()


def test_one_replica_leads_and_a_stopped_leader_hands_over_at_once(leases: Leases) -> None:
    a = Replica(leases, "a")
    until(lambda: a.led_at is not None)
    b = Replica(leases, "b")
    time.sleep(3 * TIMING.lease_duration)  # a renews: b never takes over
    assert b.led_at is None and leases.holder() == "a"
    stopped = time.monotonic()
    a.elector.stop()  # released: b need not wait for the lease to run out
    took = until(lambda: b.led_at is not None)
    assert took - stopped < TIMING.lease_duration / 2
    assert leases.holder() == "b" and record_of(leases.obj).transitions == 1  # type: ignore[union-attr]
    assert a.exited_at is None  # a clean stop ends nothing
    b.elector.stop()
    assert leases.holder() == ""


def test_a_leader_that_cannot_renew_exits_before_another_may_take_over(leases: Leases) -> None:
    a = Replica(leases, "a")
    until(lambda: a.led_at is not None)
    b = Replica(leases, "b")
    time.sleep(0.3)
    leases.failing.add("a")  # the API server stops answering a (a network partition)
    cut = time.monotonic()
    until(lambda: a.exited_at is not None)
    until(lambda: b.led_at is not None)
    assert a.exited_at is not None and b.led_at is not None
    assert a.exited_at - cut <= TIMING.renew_deadline + 0.2
    assert a.exited_at < b.led_at  # never two leaders
    assert b.led_at - cut <= TIMING.lease_duration + 4 * TIMING.retry_period * 1.2 + 0.3
    assert leases.holder() == "b"
    b.elector.stop()


def test_a_leader_whose_lease_was_taken_exits_at_its_next_renewal(leases: Leases) -> None:
    a = Replica(leases, "a")
    until(lambda: a.led_at is not None)
    body = json.loads(json.dumps(leases.obj))
    body["spec"]["holderIdentity"] = "intruder"
    leases.write(body, create=False)
    exited = until(lambda: a.exited_at is not None, timeout=1.0)
    assert exited - (a.led_at or 0) < 1.0
    assert leases.holder() == "intruder"


def test_a_leader_whose_lease_was_deleted_exits_at_its_next_renewal(leases: Leases) -> None:
    """Another replica would create a new lease at once: the leader may not wait for its deadline."""
    a = Replica(leases, "a")
    until(lambda: a.led_at is not None)
    with leases.lock:
        leases.obj = None
    deleted = time.monotonic()
    exited = until(lambda: a.exited_at is not None, timeout=1.0)
    assert exited - deleted < TIMING.renew_deadline / 2


def test_a_waiting_replica_answers_the_liveness_probe_and_frees_its_port_when_it_leads(
    leases: Leases,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    a = Replica(leases, "a")
    until(lambda: a.led_at is not None)
    b = Replica(leases, "b", liveness=url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def answer() -> dict[str, Any] | None:
        try:
            with opener.open(url, timeout=1) as resp:
                return json.loads(resp.read())
        except OSError:
            return None

    until(lambda: answer() is not None)
    assert answer() == {"leader": False, "identity": "b"}
    a.elector.stop()
    until(lambda: b.led_at is not None)
    with socket.socket() as s:  # kopf binds it next
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    b.elector.stop()
