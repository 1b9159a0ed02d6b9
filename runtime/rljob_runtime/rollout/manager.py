"""The rollout side of a job as the driver, the colocated turns and the weight transports see it.

``RolloutManager`` is used from the plain (synchronous) driver loop. It joins the engines and the
router ``launch`` started, their HTTP client (``client.EngineClient``: generation, the engines'
requests, the weight version, on an asyncio loop of its own) and the fleet that keeps them serving
(``fleet.EngineFleet``: health checks, replacement, memory release, shutdown). A failure of the
fleet (its replacements used up) is raised by the next (or the current) call.

Weight updates are the transports' (``sync/``): they open ``updating(version)`` (``engine_update``)
and post their own requests; ``refresher`` brings a relaunched engine to the current version.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from ..data.sample import Sample
from .client import EngineClient
from .engine_update import EngineUpdate
from .engines import ENGINE_CONCURRENCY, Engine, HealthCheck, Refresher
from .fleet import EngineFleet
from .generate import RetryPolicy
from .launch import ActorKwargs, launch_engines
from .router import Router

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from ..placement import Placement


class RolloutManager:
    """Engines + router + health checks + the frame of weight updates; see the module docstring."""

    def __init__(
        self,
        *,
        spec: RLTrainingJobSpec,
        router: Router,
        engines: list[Engine],
        actor_kwargs: ActorKwargs,
        refresher: Refresher | None = None,
        health: HealthCheck | None = None,
        retry: RetryPolicy | None = None,
        concurrency: int = 64,
        model_path: str | Path | None = None,
    ) -> None:
        self.spec = spec
        self.client = EngineClient(
            spec=spec,
            router_url=router.url,
            retry=retry or RetryPolicy(),
            concurrency=concurrency,
            model_path=model_path,
            on_interrupt=self.shutdown,
        )
        self.fleet = EngineFleet(
            spec=spec,
            router=router,
            engines=engines,
            actor_kwargs=actor_kwargs,
            client=self.client,
            health=health or HealthCheck.from_spec(spec),
            refresher=refresher,
        )
        if spec.training.routing_replay:  # the pinned sglang-router drops return_routed_experts
            self.client.engine_for = self.fleet.engine_for
        atexit.register(self.shutdown)

    @classmethod
    def create(
        cls,
        spec: RLTrainingJobSpec,
        model_path: str | Path,
        placement: Placement,
        *,
        refresher: Refresher | None = None,
        health: HealthCheck | None = None,
        retry: RetryPolicy | None = None,
        concurrency: int | None = None,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = 600.0,
        weights_path: str | Path | None = None,
    ) -> RolloutManager:
        """Start the router and one ``EngineActor`` per engine (``placement.engine_slots()``), registered.

        ``refresher`` (optional, may be set later) brings a relaunched engine to the current weights.
        ``weights_path``: an HF directory the engines load instead of ``model_path`` (a resumed run's
        checkpoint export); relaunched engines load ``model_path`` and are refreshed.
        ``concurrency``: requests in flight through the router; by default what the engines say they
        run at once (SGLang's schedulers, ``EngineClient.set_in_flight_limit``), ``ENGINE_CONCURRENCY``
        for an engine that does not say.
        """
        router, engines, actor_kwargs = launch_engines(
            spec,
            model_path,
            placement,
            log_dir=log_dir,
            startup_timeout_s=startup_timeout_s,
            weights_path=weights_path,
        )
        fallback = ENGINE_CONCURRENCY[spec.rollout.engine]
        manager = cls(
            spec=spec,
            router=router,
            engines=engines,
            actor_kwargs=actor_kwargs,
            refresher=refresher,
            health=health,
            retry=retry,
            concurrency=concurrency or fallback * len(engines),
            model_path=model_path,
        )
        if concurrency is None:
            manager.client.set_in_flight_limit([e.url for e in engines], fallback)
        return manager

    @property
    def refresher(self) -> Refresher | None:
        """Brings a relaunched engine to the current weights (the driver's transport sets it)."""
        return self.fleet.refresher

    @refresher.setter
    def refresher(self, refresher: Refresher | None) -> None:
        self.fleet.refresher = refresher

    # ---- generation -----------------------------------------------------------------------------

    def generate(self, samples: Sequence[Sample], **sampling_overrides: Any) -> list[Sample]:
        """Fill every sample's response (in place) through the router; returns them in order.

        ``sampling_overrides`` change ``rollout``'s sampling params (e.g. ``temperature=0`` for eval).
        """
        return self.client.wait(self.generate_async(samples, **sampling_overrides))

    def generate_async(
        self, samples: Sequence[Sample], **sampling_overrides: Any
    ) -> concurrent.futures.Future[list[Sample]]:
        """Like ``generate`` but returns at once (async training overlaps the next rollout)."""
        return self.client.generate_async(
            samples, hold=self.fleet.hold_for_replacements, **sampling_overrides
        )

    def abort(self) -> None:
        """Abort every request in flight: those samples come back with status aborted (not retried)."""
        self.client.abort(self.fleet.live_urls())

    # ---- weight updates: the frame; the transfer is the transport's (sync/) ------------------------

    @contextlib.contextmanager
    def updating(
        self, version: int | str | None = None, *, only: str | None = None
    ) -> Iterator[EngineUpdate]:
        """One weight update of every serving engine (``engine_update``); the new version is this
        manager's once the block ends without error. ``only``: the relaunched engine at that URL,
        brought to the current version (called by ``refresher`` while the replacement holds the lock)."""
        client = self.client
        client.raise_if_failed()
        if only is not None:
            tp_size = self.fleet.relaunching(only).tp_size
            fresh = EngineUpdate(client, [only], {only: tp_size}, fresh=True)
            yield fresh
            client.call(fresh.end(client.weight_version))
            return
        new = self._next_version(version)
        engines = client.call(self.fleet.begin_update())
        update: EngineUpdate | None = None
        try:
            update = EngineUpdate(
                client, [e.url for e in engines], {e.url: e.tp_size for e in engines}, fresh=False
            )
            try:
                client.call(update.begin())
                yield update
            except BaseException:
                # generation goes on with the old weights; the update's own error is the one to raise
                with contextlib.suppress(Exception):
                    client.call(update.end(None))
                raise
            client.call(update.end(new))
            client.weight_version = new
        finally:
            client.call(self.fleet.end_update(engines, update.lost if update is not None else {}))
        client.raise_if_failed()

    def _next_version(self, version: int | str | None) -> str:
        if version is not None:
            return str(version)
        current = self.client.weight_version
        return str(int(current) + 1) if current.isdigit() else "1"

    @property
    def weight_version(self) -> str:
        return self.client.weight_version

    @property
    def membership_epoch(self) -> int:
        """Bumped whenever an engine is relaunched: a weight-update group joined before is stale then."""
        return self.fleet.membership_epoch

    def set_weight_version(self, version: int | str) -> None:
        """Label the engines' current weights (a resumed run's engines loaded its checkpoint)."""
        self.client.set_weight_version(version, self.fleet.live_urls())

    def engine_tp_sizes(self) -> dict[str, int]:
        """URL -> TP ranks of every serving engine (each TP rank is one member of a weight group)."""
        return {e.url: e.tp_size for e in self.fleet.engines if e.state == "serving"}

    def call_engines(self, path: str, bodies: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """POST ``bodies[url]`` to each engine at once; the answers, or the exception each raised."""
        return self.client.call_engines(path, bodies)

    # ---- colocated memory ------------------------------------------------------------------------

    def release_memory(self) -> None:
        """Colocated engines free their GPU memory for the trainer's turn (``EngineFleet``)."""
        self.fleet.release_memory()

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """The engines take their GPU memory back, all of it or ``tags`` (``EngineFleet``)."""
        self.fleet.resume_memory(tags)

    # ---- introspection and shutdown ------------------------------------------------------------

    @property
    def router_url(self) -> str:
        return self.client.router_url

    def engine_urls(self) -> list[str]:
        return [e.url for e in self.fleet.engines]

    def engine_info(self) -> list[dict[str, Any]]:
        engines = self.fleet.engines
        infos = ray.get([e.actor.info.remote() for e in engines])
        return [
            {**info, "state": e.state, "restarts": e.restarts} for e, info in zip(engines, infos, strict=True)
        ]

    def engine_gpu_memory_gb(self) -> list[float]:
        """GPU memory each engine's server holds (GB; -1 where NVML cannot tell)."""
        return [float(x) for x in ray.get([e.actor.gpu_memory_gb.remote() for e in self.fleet.engines])]

    def kill_engine_process(self, index: int) -> None:
        """Hard-kill engine ``index``'s server (fault injection for tests and drills)."""
        self.fleet.kill_engine_process(index)

    def check_failed(self) -> None:
        """Raise the error that failed the rollout side, if any (the driver may poll this)."""
        if self.client.fatal is not None:
            raise self.client.fatal

    def shutdown(self) -> None:
        """Stop health checks, the router and every engine (server and actor); idempotent."""
        if self.client.closed:
            return
        atexit.unregister(self.shutdown)
        self.client.close()
        self.fleet.shutdown()

    def __enter__(self) -> RolloutManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
