"""The engines as a fleet, once launched (``launch``): health-checked, replaced when they die, their
GPU memory released and resumed for a colocated trainer, shut down with the router.

Fault tolerance (beyond slime, which re-creates dead engines only at the next weight update): a
failed health check replaces the engine at once: deregister it from the router, kill its server,
relaunch it on the same bundle, wait until healthy, push the current weights, register it again.
Requests that were on the dead engine fail and are retried through the router on live engines
(``generate.RetryPolicy``), so no sample is lost. Every replacement (and every failed relaunch)
counts against ``faultTolerance.maxEngineRestarts``; one more failure than that fails the run with
``EngineRestartsExhausted``, raised by the next (or the current) manager call. A relaunched engine
is brought to the current version by ``refresher`` (the driver's transport): no copy of the weights
is kept here. Health checks and replacements run on the client's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import ray

from .. import engine_api
from .client import EngineClient
from .engine_actor import EngineStartError
from .engines import Engine, HealthCheck, Refresher, kill_actor
from .errors import EngineGone, EngineRestartsExhausted, RolloutError, WeightUpdateError
from .launch import ActorKwargs, new_actor

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from ..data.sample import Sample
    from .router import Router

log = logging.getLogger("rljob.rollout.manager")


class EngineFleet:
    """The engines behind ``router``, kept serving; see the module docstring."""

    weights_lock: asyncio.Lock  # held by a weight update and by a replacement's registration

    def __init__(
        self,
        *,
        spec: RLTrainingJobSpec,
        router: Router,
        engines: list[Engine],
        actor_kwargs: ActorKwargs,
        client: EngineClient,
        health: HealthCheck,
        refresher: Refresher | None = None,
    ) -> None:
        self.spec = spec
        self.router = router
        self.engines = engines
        self._actor_kwargs = actor_kwargs
        self.client = client
        self.health = health
        self.refresher = refresher
        self.max_restarts = int(spec.fault_tolerance.max_engine_restarts)
        self.restarts = 0
        # bumped whenever an engine is relaunched: a weight-update group joined before is stale then
        self.membership_epoch = 0
        self.health_paused = False
        self._replacements: set[asyncio.Task[None]] = set()
        client.call(self._start())

    async def _start(self) -> None:
        self.weights_lock = asyncio.Lock()
        for engine in self.engines:
            engine.busy = asyncio.Lock()
            if self.health.enabled:
                engine.health_task = asyncio.create_task(
                    self._health_loop(engine), name=f"health-engine{engine.index}"
                )

    def live(self) -> list[Engine]:
        return [e for e in self.engines if e.state in ("serving", "updating")]

    def live_urls(self) -> list[str]:
        return [e.url for e in self.live()]

    async def hold_for_replacements(self) -> bool:
        """``generate``'s hold: while no engine serves and one is being replaced, wait for it (an
        SGLang relaunch outlasts the retries); True if it waited."""

        def serving() -> bool:
            return any(e.state in ("serving", "updating") for e in self.engines)

        if serving() or not self._replacements:
            return False
        while not serving() and self._replacements and self.client.fatal is None and not self.client.closed:
            await asyncio.sleep(0.5)
        return True

    def engine_for(self, sample: Sample) -> str:
        """The engine a sample's request goes to without the router (training.routingReplay): its
        prompt group's among the serving engines, so the group's prompt prefix is cached there (any
        engine while none serves: the request's retries wait for a replacement, then ask again)."""
        serving = [e for e in self.engines if e.state == "serving"] or self.engines
        key = sample.group_index if sample.group_index is not None else sample.index or 0
        return serving[key % len(serving)].url

    # ---- health checks and replacement ----------------------------------------------------------

    async def _health_loop(self, engine: Engine) -> None:
        await asyncio.sleep(self.health.first_wait_s)
        while not self.client.closed and self.client.fatal is None:
            await asyncio.sleep(self.health.interval_s)
            if engine.state != "serving" or self.health_paused:
                continue
            problem = await self._check(engine)
            # an update or a memory release may have begun while we waited: not a death
            if problem is None or engine.state != "serving" or self.health_paused:
                continue
            await self.start_replacement(engine, problem)

    async def _check(self, engine: Engine) -> str | None:
        """``/health_generate`` unless a memory release or resume holds the engine (then: healthy)."""
        assert engine.busy is not None
        if engine.busy.locked():
            return None
        async with engine.busy:
            try:
                status, answer = await self.client.request(
                    engine.url, "GET", "/health_generate", timeout=self.health.timeout_s
                )
            except EngineGone as exc:
                return str(exc)
        return None if status == 200 else f"/health_generate answered {status}: {answer}"

    def start_replacement(self, engine: Engine, reason: str) -> asyncio.Task[None]:
        engine.state = "replacing"
        task = asyncio.create_task(self._replace(engine, reason, claimed=True))
        self._replacements.add(task)  # keep a reference until it is done
        task.add_done_callback(self._replacements.discard)
        return task

    async def _settle(self) -> None:
        """Wait for replacements in progress (a relaunched engine holds GPU memory and asks the trainer
        for weights: neither may overlap the trainer's turn)."""
        while self._replacements:
            await asyncio.gather(*list(self._replacements), return_exceptions=True)

    async def _replace(self, engine: Engine, reason: str, *, claimed: bool = False) -> None:
        """Deregister, kill, relaunch on the same bundle, push current weights, register."""
        if engine.state == "replacing" and not claimed:
            return
        engine.state = "replacing"
        old_url = engine.url
        began = time.monotonic()
        log.warning("engine %d (%s) failed its health check: %s; replacing it", engine.index, old_url, reason)
        try:
            await asyncio.to_thread(self.router.remove_worker, old_url)
            while True:
                self.restarts += 1
                engine.restarts += 1
                if self.restarts > self.max_restarts:
                    with contextlib.suppress(ray.exceptions.RayActorError):
                        await engine.actor.kill.remote()
                    raise EngineRestartsExhausted(
                        f"engine {engine.index} ({old_url}) failed ({reason}) and faultTolerance."
                        f"maxEngineRestarts={self.max_restarts} replacements are used up"
                    )
                try:
                    url = await self._relaunch(engine)
                    engine.pending_url = url
                    async with self.weights_lock:  # an update in progress finishes first; we push the newest
                        await self.push_current_weights(url, engine.index)
                        await asyncio.to_thread(self.router.add_worker, url)
                        engine.url, engine.pending_url = url, None
                        engine.state = "serving"
                        engine.last_replacement_s = time.monotonic() - began
                        self.membership_epoch += 1
                    break
                except (EngineStartError, EngineGone, WeightUpdateError) as exc:
                    reason = f"relaunch failed: {str(exc)[-2000:]}"
                    log.error("engine %d: %s", engine.index, reason)
            log.warning(
                "engine %d replaced in %.1f s: %s -> %s (restart %d of %d allowed), weight version %s",
                engine.index,
                engine.last_replacement_s,
                old_url,
                url,
                self.restarts,
                self.max_restarts,
                self.client.weight_version,
            )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            engine.state = "failed"
            self.client.fail(exc)

    async def _relaunch(self, engine: Engine) -> str:
        try:
            return str(await engine.actor.restart.remote())
        except ray.exceptions.RayActorError:
            # the actor itself is gone (its process or node died): a new one on the same bundle
            kill_actor(engine.actor)
            engine.actor = new_actor(self.spec, engine.slot, self._actor_kwargs(engine.index))
            return str(await engine.actor.start.remote())

    async def push_current_weights(self, url: str, index: int) -> None:
        """Bring a relaunched engine (not yet registered) to the current weight version."""
        if self.client.weight_version == engine_api.DEFAULT_WEIGHT_VERSION:
            return  # never updated: the relaunched engine loaded the initial weights
        if self.refresher is None:
            raise WeightUpdateError(
                f"engine {index} was relaunched with the initial weights and nothing can bring it to "
                f"version {self.client.weight_version} (no refresher)"
            )
        await asyncio.to_thread(self.refresher, url)

    # ---- weight updates: which engines take part --------------------------------------------------

    async def begin_update(self) -> list[Engine]:
        """Take the weights lock and mark every serving engine updating; those engines."""
        await self.weights_lock.acquire()
        engines = [e for e in self.engines if e.state == "serving"]
        for engine in engines:
            engine.state = "updating"
        return engines

    async def end_update(self, engines: Sequence[Engine], lost: Mapping[str, str]) -> None:
        """The update's engines serve again, those it ``lost`` (url -> why) are replaced; unlock."""
        for engine in engines:
            if engine.url in lost:
                # dead mid-update: its replacement (after we release the lock) gets the new version
                self.start_replacement(engine, f"weight update failed: {lost[engine.url]}")
            elif engine.state == "updating":
                engine.state = "serving"
        self.weights_lock.release()

    def relaunching(self, url: str) -> Engine:
        """The engine a replacement is bringing up at ``url`` (not yet its ``Engine.url``)."""
        for engine in self.engines:
            if engine.state == "replacing" and engine.pending_url == url:
                return engine
        raise RolloutError(f"no engine is being brought up at {url}")

    # ---- colocated memory ------------------------------------------------------------------------

    def release_memory(self) -> None:
        """Colocated engines free their GPU memory (weights, KV cache, CUDA graphs) for the trainer.
        Replacements in progress finish first; each engine is idle (flushed) and not health-checked
        when it releases; health checks stay paused until ``resume_memory`` brought the KV cache back."""
        self.client.raise_if_failed()
        self.health_paused = True
        self.client.call(self._settle())
        self.client.raise_if_failed()
        self.client.call(self._each_engine_held("/release_memory_occupation", [None], idle_first=True))

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """``tags`` None: weights, then KV cache and CUDA graphs (SGLang's order), and health checks
        resume. ``["weights"]``: only the weights (a colocated sync writes them before the KV cache
        comes back); ``["kv_cache", "cuda_graph"]``: the rest, and health checks resume."""
        self.client.raise_if_failed()
        tag_sets = [["weights"], ["kv_cache", "cuda_graph"]] if tags is None else [list(tags)]
        self.client.call(self._each_engine_held("/resume_memory_occupation", tag_sets, idle_first=False))
        if tags is None or "kv_cache" in tags:
            self.health_paused = False

    async def _each_engine_held(
        self, path: str, tag_sets: Sequence[Sequence[str] | None], *, idle_first: bool
    ) -> None:
        async def one(engine: Engine) -> None:
            assert engine.busy is not None
            async with engine.busy:  # no health check's generation runs meanwhile
                if idle_first:
                    await self.client.wait_idle(engine.url, 120, 0.5)
                for tags in tag_sets:
                    await self.client.expect(
                        engine.url, "POST", path, engine_api.memory_occupation_body(tags)
                    )

        await asyncio.gather(*(one(e) for e in self.live()))

    # ---- fault injection and shutdown ----------------------------------------------------------

    def kill_engine_process(self, index: int) -> None:
        """Hard-kill engine ``index``'s server (fault injection for tests and drills)."""
        ray.get(self.engines[index].actor.kill.remote())

    def shutdown(self) -> None:
        """Stop the router and every engine (server and actor)."""
        self.router.stop()
        refs = [e.actor.shutdown.remote() for e in self.engines]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=15)
        except Exception as exc:  # a dead actor: its server died with it (PDEATHSIG)
            log.warning("rollout manager: engine shutdown: %s", exc)
        for engine in self.engines:
            kill_actor(engine.actor)
