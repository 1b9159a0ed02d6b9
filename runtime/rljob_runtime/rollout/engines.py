"""The rollout manager's records and settings: one ``Engine`` per engine, the health checks'
settings, how many requests each kind of engine takes at once, and killing an engine's actor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import ray

log = logging.getLogger("rljob.rollout.manager")

EngineState = Literal["serving", "updating", "replacing", "failed"]


@dataclass(frozen=True)
class HealthCheck:
    enabled: bool = True
    first_wait_s: float = 300.0
    interval_s: float = 30.0
    timeout_s: float = 30.0

    @classmethod
    def from_spec(cls, spec: Any) -> HealthCheck:
        hc = spec.fault_tolerance.engine_health_check
        return cls(hc.enabled, hc.first_wait_seconds, hc.interval_seconds, hc.timeout_seconds)


@dataclass
class Engine:
    index: int
    slot: Any  # placement.Slot: the engine's first bundle
    actor: Any
    url: str
    state: EngineState = "serving"
    restarts: int = 0
    last_replacement_s: float | None = None  # failed check -> registered again
    tp_size: int = 1
    pending_url: str | None = None  # a relaunched server's URL until it is registered
    health_task: asyncio.Task[None] | None = field(default=None, repr=False)
    # held by a health check's request and by memory release/resume: SGLang refuses (asserts) a
    # release while any request, a health check's one-token generation included, is running
    busy: asyncio.Lock | None = field(default=None, repr=False)


Refresher = Callable[[str], None]  # brings the relaunched engine at this URL to the current weights
# Requests in flight per engine when its /server_info does not say how many it runs at once (the
# client asks first: EngineClient.set_in_flight_limit). SGLang's default is 2048-4096 per scheduler.
ENGINE_CONCURRENCY = {"sglang": 512, "hf": 64}


def kill_actor(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:  # already dead, or Ray is shutting down
        log.debug("ray.kill: %s", exc)
