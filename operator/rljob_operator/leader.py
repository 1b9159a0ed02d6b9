"""Leader election on a coordination.k8s.io/v1 Lease (pure): what a replica does with the lease it read.

The operator's replicas share one Lease. Its holder renews it every retry period; a replica that
sees the lease unchanged (the same holder and renew time) for the lease's duration, measured on its
own clock from the moment it saw it change, takes it over. That is the rule of client-go's
leaderelection (kube-controller-manager, controller-runtime): no two clocks are ever compared, so
clock skew between nodes cannot make two leaders. The holder gives up (its process exits) once it
has gone `renew_deadline` without a successful renewal, which is shorter than the lease, so it has
stopped before any other replica may take over. A holder that stops cleanly releases the lease (no
holder, a duration of one second), and the next replica takes it at its next try.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

# A replica waiting for the lease tries every retry period times up to this (client-go's JitterFactor),
# so that replicas started together do not try in lockstep.
JITTER = 1.2
LEASE_API_VERSION = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class Timing:
    """Seconds: how long a lease lasts unrenewed, how long a leader may go without renewing before it
    gives up, how often it renews (and the others try)."""

    lease_duration: float = 10.0
    renew_deadline: float = 7.0
    retry_period: float = 1.0

    def problems(self) -> list[str]:
        """What makes this timing unsafe or unworkable (client-go refuses the same)."""
        out = []
        if self.lease_duration <= self.renew_deadline:
            out.append(
                f"the renew deadline ({self.renew_deadline:g} s) must be shorter than the lease duration "
                f"({self.lease_duration:g} s): a leader must give up before another replica may take over"
            )
        if self.renew_deadline <= JITTER * self.retry_period:
            out.append(
                f"the renew deadline ({self.renew_deadline:g} s) must be longer than {JITTER:g} times the retry "
                f"period ({self.retry_period:g} s): a leader must have time to renew at least once"
            )
        if min(self.lease_duration, self.renew_deadline, self.retry_period) <= 0:
            out.append("the lease duration, renew deadline and retry period must be positive")
        elif self.lease_duration != int(self.lease_duration):
            out.append(
                f"the lease duration ({self.lease_duration:g} s) must be whole seconds (a Lease's field)"
            )
        return out


@dataclass(frozen=True)
class Record:
    """What a Lease's spec says about who leads."""

    holder: str  # "" when nobody holds it (released)
    lease_duration_s: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int


def micro_time(moment: datetime) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_of(lease: Mapping[str, Any] | None) -> Record | None:
    """The Lease's record; None when there is no Lease."""
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    return Record(
        holder=spec.get("holderIdentity") or "",
        lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_body(
    namespace: str, name: str, record: Record, resource_version: str | None = None
) -> dict[str, Any]:
    """The Lease to create, or to replace (with the resourceVersion it was read at: a write that races
    another replica's fails with a conflict instead of overwriting it)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        meta["resourceVersion"] = resource_version
    spec: dict[str, Any] = {
        "holderIdentity": record.holder or None,
        "leaseDurationSeconds": record.lease_duration_s,
        "acquireTime": record.acquire_time,
        "renewTime": record.renew_time,
        "leaseTransitions": record.transitions,
    }
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": meta,
        "spec": {k: v for k, v in spec.items() if v is not None},
    }


@dataclass(frozen=True)
class Seen:
    """The lease record as last read, and when (monotonic seconds) this replica first saw it so."""

    record: Record | None
    since: float


def observe(seen: Seen | None, record: Record | None, now: float) -> Seen:
    """A new read: the clock restarts only when the record changed (a renewal changes renewTime)."""
    if seen is not None and seen.record == record:
        return seen
    return Seen(record, now)


@dataclass(frozen=True)
class Step:
    """What to do next: create the Lease, update it (to renew or take it over), or wait."""

    action: Literal["create", "update", "wait"]
    record: Record | None  # the record to write (None when waiting)
    why: str


def next_step(seen: Seen, me: str, now: float, wall: datetime, timing: Timing) -> Step:
    """This replica's move, from the lease as it has seen it (`now`: monotonic seconds, `wall`: the
    time written into the lease)."""
    record, stamp = seen.record, micro_time(wall)
    duration = int(timing.lease_duration)
    if record is None:
        return Step("create", Record(me, duration, stamp, stamp, 0), "no lease yet")
    if record.holder == me:
        return Step("update", renewed(record, wall, timing), "renew")
    if record.holder:
        left = seen.since + record.lease_duration_s - now
        if left > 0:
            return Step("wait", None, f"held by {record.holder} (free in {left:.1f} s unless renewed)")
        why = f"{record.holder} did not renew it for {record.lease_duration_s} s"
    else:
        why = "released by its last holder"
    return Step("update", Record(me, duration, stamp, stamp, record.transitions + 1), why)


def renewed(record: Record, wall: datetime, timing: Timing) -> Record:
    """The holder's renewal: a new renew time (and its lease duration, should it have changed)."""
    return dataclasses.replace(
        record, lease_duration_s=int(timing.lease_duration), renew_time=micro_time(wall)
    )


def released(record: Record, wall: datetime) -> Record:
    """The record a leader writes when it stops: nobody holds it and it lasts a second (client-go's)."""
    return dataclasses.replace(record, holder="", lease_duration_s=1, renew_time=micro_time(wall))
