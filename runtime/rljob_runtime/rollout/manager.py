# long-file: engine client, engine fleet and the driver's facade in one class; not yet split
"""The rollout side of a job: engines on their placement bundles, the router, health checks, weights.

``RolloutManager`` is used from the plain (synchronous) driver loop; inside, it runs an asyncio loop
on a thread of its own, for generation and for one health-check task per engine.

Fault tolerance (beyond slime, which re-creates dead engines only at the next weight update): a
failed health check replaces the engine at once: deregister it from the router, kill its server,
relaunch it on the same bundle, wait until healthy, push the current weights, register it again.
Requests that were on the dead engine fail and are retried through the router on live engines
(``generate.RetryPolicy``), so no sample is lost. Every replacement (and every failed relaunch)
counts against ``faultTolerance.maxEngineRestarts``; one more failure than that fails the run with
``EngineRestartsExhausted``, raised by the next (or the current) manager call.

Weight updates are the transports' (``sync/``): they open ``updating(version)`` (``engine_update``)
and post their own requests. A relaunched engine is brought to the current version by ``refresher``
(the driver's transport), so no copy of the weights is kept here.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import ray

from .. import engine_api
from ..data.sample import Sample
from ..models.resolve import resolve_tokenizer
from .custom_generate import Hook, generate_samples_with_hook, load_hook
from .engine_actor import EngineActor, EngineStartError, actor_options, engine_seed
from .engine_update import EngineUpdate
from .engines import ENGINE_CONCURRENCY, Engine, HealthCheck, Refresher, kill_actor
from .errors import EngineGone, EngineRestartsExhausted, RolloutError, WeightUpdateError
from .generate import RetryPolicy, generate_samples, sampling_params_from_spec
from .router import Router

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from ..placement import Placement

log = logging.getLogger("rljob.rollout.manager")

T = TypeVar("T")


class RolloutManager:
    """Engines + router + health checks + the frame of weight updates; see the module docstring."""

    def __init__(
        self,
        *,
        spec: RLTrainingJobSpec,
        router: Router,
        engines: list[Engine],
        actor_kwargs: Callable[[int], dict[str, Any]],
        refresher: Refresher | None = None,
        health: HealthCheck | None = None,
        retry: RetryPolicy | None = None,
        concurrency: int = 64,
        model_path: str | Path | None = None,
    ) -> None:
        self.spec = spec
        self.model_path = str(model_path) if model_path is not None else None
        self.router = router
        self.engines = engines
        self._actor_kwargs = actor_kwargs
        self.refresher = refresher
        self.health = health or HealthCheck.from_spec(spec)
        self.retry = retry or RetryPolicy()
        self.concurrency = concurrency
        self.max_restarts = int(spec.fault_tolerance.max_engine_restarts)
        self.restarts = 0
        self.weight_version = engine_api.DEFAULT_WEIGHT_VERSION
        # bumped whenever an engine is relaunched: a weight-update group joined before is stale then
        self.membership_epoch = 0
        self._fatal: BaseException | None = None
        self._closed = False
        self._health_paused = False
        self._cancelling = False
        self._generations: set[asyncio.Task[Any]] = set()
        self._hook: Hook | None = None  # rollout.customGenerate, loaded on first use
        self._tokenizer: Any = None
        self._hook_lock = threading.Lock()  # generate_async may be called from several driver threads
        self._replacements: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-manager", daemon=True)
        self._thread.start()
        self._weights_lock: asyncio.Lock = self._call(self._make_lock())
        for engine in engines:
            engine.busy = self._call(self._make_lock())
        self._session: aiohttp.ClientSession | None = None
        atexit.register(self.shutdown)
        if self.health.enabled:
            for engine in engines:
                self._call(self._start_health(engine))

    # ---- construction ---------------------------------------------------------------------------

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
        ``concurrency``: requests in flight through the router, default ``ENGINE_CONCURRENCY`` per
        engine (SGLang batches continuously: a whole rollout's requests at once fill its batch).
        """
        rollout, resources = spec.rollout, spec.resources
        device = resources.device
        first_slots = [slots[0] for slots in placement.engine_slots()]
        if not first_slots:
            raise RolloutError("the placement has no rollout slots")
        tokenizer_path = str(resolve_tokenizer(spec.model.tokenizer)) if spec.model.tokenizer else None

        def actor_kwargs(index: int) -> dict[str, Any]:
            return dict(
                kind=rollout.engine,
                model_path=str(model_path),
                model_reference=spec.model.path,
                tokenizer_path=tokenizer_path,
                tokenizer_reference=spec.model.tokenizer,
                trust_remote_code=spec.model.trust_remote_code,
                index=index,
                dtype=spec.model.dtype,
                device=device,
                seed=engine_seed(spec.training.seed, index),
                tp_size=placement.gpus_per_engine,
                enable_memory_saver=placement.colocated and rollout.engine == "sglang",
                sglang_args=dict(rollout.sglang_args),
                log_dir=str(Path(log_dir) / f"engine{index}") if log_dir else None,
                startup_timeout_s=startup_timeout_s,
            )

        actors: list[Any] = [  # Ray actor handles
            EngineActor.options(**actor_options(slot, colocated=placement.colocated, device=device)).remote(
                **actor_kwargs(index)
            )
            for index, slot in enumerate(first_slots)
        ]
        router: Router | None = None
        try:
            start_path = str(weights_path) if weights_path is not None else None
            urls = ray.get([actor.start.remote(start_path) for actor in actors])
            router = Router.start(
                policy=rollout.router.policy, log_dir=Path(log_dir) / "router" if log_dir else None
            )
            for url in urls:
                router.add_worker(url)
        except BaseException:
            if router is not None:
                router.stop()
            for actor in actors:
                kill_actor(actor)
            raise
        engines = [
            Engine(index, slot, actor, url, tp_size=placement.gpus_per_engine)
            for index, (slot, actor, url) in enumerate(zip(first_slots, actors, urls, strict=True))
        ]
        return cls(
            spec=spec,
            router=router,
            engines=engines,
            actor_kwargs=actor_kwargs,
            refresher=refresher,
            health=health,
            retry=retry,
            concurrency=concurrency or ENGINE_CONCURRENCY[rollout.engine] * len(engines),
            model_path=model_path,
        )

    def _new_actor(self, engine: Engine) -> Any:
        res = self.spec.resources
        options = actor_options(engine.slot, colocated=res.colocate, device=res.device)
        return EngineActor.options(**options).remote(**self._actor_kwargs(engine.index))

    # ---- the loop thread ------------------------------------------------------------------------

    @staticmethod
    async def _make_lock() -> asyncio.Lock:
        return asyncio.Lock()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the manager's loop and wait."""
        return self._wait(self._submit(coro))

    def _wait(self, future: concurrent.futures.Future[T]) -> T:
        """Wait for a loop future; Ctrl-C shuts everything down, a fatal error is raised as itself."""
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            self.shutdown()
            raise
        except concurrent.futures.CancelledError:
            self._raise_if_failed()
            raise

    def _raise_if_failed(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise RolloutError("the rollout manager is shut down")

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # no connection cap of aiohttp's own (100 by default): ``concurrency`` bounds the requests,
            # and a rollout's 256 requests must all reach SGLang to fill its batch
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def _engine_request(
        self, url: str, method: str, path: str, body: Any = None, timeout: float = 600.0
    ) -> tuple[int, Any]:
        session = await self._http()
        try:
            async with session.request(
                method, f"{url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                text = await resp.text()
                try:
                    payload: Any = await resp.json(content_type=None) if text else None
                except ValueError:
                    payload = text
                if resp.status >= 500:
                    raise EngineGone(f"{method} {url}{path}: HTTP {resp.status} {text[:300]}")
                return resp.status, payload
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineGone(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc

    # ---- generation -----------------------------------------------------------------------------

    def generate(self, samples: Sequence[Sample], **sampling_overrides: Any) -> list[Sample]:
        """Fill every sample's response (in place) through the router; returns them in order.

        ``sampling_overrides`` change ``rollout``'s sampling params (e.g. ``temperature=0`` for eval).
        """
        return self._wait(self.generate_async(samples, **sampling_overrides))

    def generate_async(
        self, samples: Sequence[Sample], **sampling_overrides: Any
    ) -> concurrent.futures.Future[list[Sample]]:
        """Like ``generate`` but returns at once (async training overlaps the next rollout)."""
        self._raise_if_failed()
        params = sampling_params_from_spec(self.spec.rollout, **sampling_overrides)
        self._load_hook()  # here, on the caller's thread: importing must not block the loop
        return self._submit(self._generate(list(samples), params))

    def _load_hook(self) -> None:
        """Import rollout.customGenerate and load the tokenizer it gets, once."""
        path = self.spec.rollout.custom_generate
        if not path or self._hook is not None:
            return
        with self._hook_lock:
            if self._hook is not None:
                return
            hook = load_hook(path)
            source: str | None
            if self.spec.model.tokenizer:  # a directory, or a hub id: the copy prepare downloaded
                source = str(resolve_tokenizer(self.spec.model.tokenizer))
            else:
                source = self.model_path
            if source is None:
                raise RolloutError(
                    f"rollout.customGenerate {path!r}: no model path to load the tokenizer from"
                )
            from transformers import AutoTokenizer  # heavy: only runs with a hook

            self._tokenizer = AutoTokenizer.from_pretrained(
                source, trust_remote_code=self.spec.model.trust_remote_code
            )
            self._hook = hook

    async def _generate(self, samples: list[Sample], params: dict[str, Any]) -> list[Sample]:
        task = asyncio.current_task()
        assert task is not None
        self._generations.add(task)
        self._cancelling = False
        try:
            if self._hook is not None:
                return await generate_samples_with_hook(
                    self._hook,
                    self.router.url,
                    samples,
                    params,
                    tokenizer=self._tokenizer,
                    spec=self.spec,
                    concurrency=self.concurrency,
                    retry=self.retry,
                    cancelled=lambda: self._cancelling,
                    session=await self._http(),
                    hold=self._hold_for_replacements,
                )
            return await generate_samples(
                self.router.url,
                samples,
                params,
                concurrency=self.concurrency,
                retry=self.retry,
                cancelled=lambda: self._cancelling,
                # partial rollout: a request a weight update aborts is continued, not restarted
                continue_aborted=self.spec.rollout.partial_rollout,
                session=await self._http(),
                hold=self._hold_for_replacements,
            )
        except asyncio.CancelledError:
            if self._fatal is not None:
                raise self._fatal from None
            raise
        finally:
            self._generations.discard(task)

    async def _hold_for_replacements(self) -> bool:
        """``generate``'s hold: while no engine serves and one is being replaced, wait for it (an
        SGLang relaunch outlasts the retries); True if it waited."""

        def serving() -> bool:
            return any(e.state in ("serving", "updating") for e in self.engines)

        if serving() or not self._replacements:
            return False
        while not serving() and self._replacements and self._fatal is None and not self._closed:
            await asyncio.sleep(0.5)
        return True

    def abort(self) -> None:
        """Abort every request in flight: those samples come back with status aborted (not retried)."""
        self._cancelling = True

        async def run() -> None:
            await asyncio.gather(
                *(
                    self._engine_request(e.url, "POST", "/abort_request", engine_api.abort_body())
                    for e in self._live()
                ),
                return_exceptions=True,
            )

        self._call(run())

    # ---- health checks and replacement ----------------------------------------------------------

    async def _start_health(self, engine: Engine) -> None:
        engine.health_task = asyncio.create_task(
            self._health_loop(engine), name=f"health-engine{engine.index}"
        )

    async def _health_loop(self, engine: Engine) -> None:
        await asyncio.sleep(self.health.first_wait_s)
        while not self._closed and self._fatal is None:
            await asyncio.sleep(self.health.interval_s)
            if engine.state != "serving" or self._health_paused:
                continue
            problem = await self._check(engine)
            # an update or a memory release may have begun while we waited: not a death
            if problem is None or engine.state != "serving" or self._health_paused:
                continue
            await self._start_replacement(engine, problem)

    async def _check(self, engine: Engine) -> str | None:
        """``/health_generate`` unless a memory release or resume holds the engine (then: healthy)."""
        assert engine.busy is not None
        if engine.busy.locked():
            return None
        async with engine.busy:
            try:
                status, answer = await self._engine_request(
                    engine.url, "GET", "/health_generate", timeout=self.health.timeout_s
                )
            except EngineGone as exc:
                return str(exc)
        return None if status == 200 else f"/health_generate answered {status}: {answer}"

    def _start_replacement(self, engine: Engine, reason: str) -> asyncio.Task[None]:
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
                    await self._kill_engine(engine)
                    raise EngineRestartsExhausted(
                        f"engine {engine.index} ({old_url}) failed ({reason}) and faultTolerance."
                        f"maxEngineRestarts={self.max_restarts} replacements are used up"
                    )
                try:
                    url = await self._relaunch(engine)
                    engine.pending_url = url
                    async with self._weights_lock:  # an update in progress finishes first; we push the newest
                        await self._push_current_weights(url, engine.index)
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
                self.weight_version,
            )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            engine.state = "failed"
            self._fail(exc)

    async def _kill_engine(self, engine: Engine) -> None:
        with contextlib.suppress(ray.exceptions.RayActorError):
            await engine.actor.kill.remote()

    async def _relaunch(self, engine: Engine) -> str:
        try:
            return str(await engine.actor.restart.remote())
        except ray.exceptions.RayActorError:
            # the actor itself is gone (its process or node died): a new one on the same bundle
            kill_actor(engine.actor)
            engine.actor = self._new_actor(engine)
            return str(await engine.actor.start.remote())

    def _fail(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc
            log.error("rollout failed: %s", exc)
        for task in list(self._generations):
            task.cancel()

    def _live(self) -> list[Engine]:
        return [e for e in self.engines if e.state in ("serving", "updating")]

    async def _push_current_weights(self, url: str, index: int) -> None:
        """Bring a relaunched engine (not yet registered) to the current weight version."""
        if self.weight_version == engine_api.DEFAULT_WEIGHT_VERSION:
            return  # never updated: the relaunched engine loaded the initial weights
        if self.refresher is None:
            raise WeightUpdateError(
                f"engine {index} was relaunched with the initial weights and nothing can bring it to "
                f"version {self.weight_version} (no refresher)"
            )
        await asyncio.to_thread(self.refresher, url)

    # ---- weight updates: the frame; the transfer is the transport's (sync/) ------------------------

    @contextlib.contextmanager
    def updating(
        self, version: int | str | None = None, *, only: str | None = None
    ) -> Iterator[EngineUpdate]:
        """One weight update of every serving engine (``engine_update``); the new version is this
        manager's once the block ends without error. ``only``: the relaunched engine at that URL,
        brought to the current version (called by ``refresher`` while the replacement holds the lock)."""
        self._raise_if_failed()
        if only is not None:
            fresh = EngineUpdate(self, [only], {only: self._relaunching(only).tp_size}, fresh=True)
            yield fresh
            self._call(fresh.end(self.weight_version))
            return
        new = self._next_version(version)
        self._call(self._weights_lock.acquire())
        engines: list[Engine] = []
        update: EngineUpdate | None = None
        try:
            engines = [e for e in self.engines if e.state == "serving"]
            for engine in engines:
                engine.state = "updating"
            update = EngineUpdate(
                self, [e.url for e in engines], {e.url: e.tp_size for e in engines}, fresh=False
            )
            try:
                self._call(update.begin())
                yield update
            except BaseException:
                # generation goes on with the old weights; the update's own error is the one to raise
                with contextlib.suppress(Exception):
                    self._call(update.end(None))
                raise
            self._call(update.end(new))
            self.weight_version = new
        finally:
            self._call(self._after_update(engines, update))
        self._raise_if_failed()

    def _relaunching(self, url: str) -> Engine:
        """The engine a replacement is bringing up at ``url`` (not yet its ``Engine.url``)."""
        for engine in self.engines:
            if engine.state == "replacing" and engine.pending_url == url:
                return engine
        raise RolloutError(f"no engine is being brought up at {url}")

    async def _after_update(self, engines: list[Engine], update: EngineUpdate | None) -> None:
        lost = update.lost if update is not None else {}
        for engine in engines:
            if engine.url in lost:
                # dead mid-update: its replacement (after we release the lock) gets the new version
                self._start_replacement(engine, f"weight update failed: {lost[engine.url]}")
            elif engine.state == "updating":
                engine.state = "serving"
        self._weights_lock.release()

    def _next_version(self, version: int | str | None) -> str:
        if version is not None:
            return str(version)
        current = self.weight_version
        return str(int(current) + 1) if current.isdigit() else "1"

    async def _wait_idle(self, url: str, attempts: int, backoff_s: float) -> None:
        """``/flush_cache`` until it answers 200: SGLang refuses it while requests run or wait."""
        for _ in range(attempts):
            status, _answer = await self._engine_request(url, "GET", "/flush_cache", timeout=30)
            if status == 200:
                return
            await asyncio.sleep(backoff_s)
        raise WeightUpdateError(f"{url}/flush_cache still refused after {attempts * backoff_s:.0f} s")

    def set_weight_version(self, version: int | str) -> None:
        """Label the engines' current weights (a resumed run's engines loaded its checkpoint)."""
        self._raise_if_failed()
        self.weight_version = str(version)
        body = engine_api.update_weight_version_body(self.weight_version)
        self._call(self._all_live("POST", "/update_weight_version", lambda _url: body))

    def engine_tp_sizes(self) -> dict[str, int]:
        """URL -> TP ranks of every serving engine (each TP rank is one member of a weight group)."""
        return {e.url: e.tp_size for e in self.engines if e.state == "serving"}

    def call_engines(self, path: str, bodies: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """POST ``bodies[url]`` to each engine at once (e.g. joining a weight-update group, which blocks
        until every member joined); the answers, or the exception each raised."""
        return self._call(self._post_many(path, bodies))

    async def _post_many(self, path: str, bodies: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        urls = list(bodies)
        answers = await asyncio.gather(
            *(self._expect(u, "POST", path, bodies[u]) for u in urls), return_exceptions=True
        )
        return dict(zip(urls, answers, strict=True))

    async def _expect(self, url: str, method: str, path: str, body: Any) -> Any:
        status, answer = await self._engine_request(url, method, path, body)
        if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
            raise WeightUpdateError(f"{method} {url}{path}: HTTP {status} {answer}")
        return answer

    async def _all_live(self, method: str, path: str, body: Callable[[str], Any]) -> None:
        await asyncio.gather(*(self._expect(e.url, method, path, body(e.url)) for e in self._live()))

    # ---- colocated memory ------------------------------------------------------------------------

    def release_memory(self) -> None:
        """Colocated engines free their GPU memory (weights, KV cache, CUDA graphs) for the trainer.
        Replacements in progress finish first; each engine is idle (flushed) and not health-checked
        when it releases; health checks stay paused until ``resume_memory`` brought the KV cache back."""
        self._raise_if_failed()
        self._health_paused = True
        self._call(self._settle())
        self._raise_if_failed()
        self._call(self._each_engine_held("/release_memory_occupation", [None], idle_first=True))

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """``tags`` None: weights, then KV cache and CUDA graphs (SGLang's order), and health checks
        resume. ``["weights"]``: only the weights (a colocated sync writes them before the KV cache
        comes back); ``["kv_cache", "cuda_graph"]``: the rest, and health checks resume."""
        self._raise_if_failed()
        tag_sets = [["weights"], ["kv_cache", "cuda_graph"]] if tags is None else [list(tags)]
        self._call(self._each_engine_held("/resume_memory_occupation", tag_sets, idle_first=False))
        if tags is None or "kv_cache" in tags:
            self._health_paused = False

    async def _each_engine_held(
        self, path: str, tag_sets: Sequence[Sequence[str] | None], *, idle_first: bool
    ) -> None:
        async def one(engine: Engine) -> None:
            assert engine.busy is not None
            async with engine.busy:  # no health check's generation runs meanwhile
                if idle_first:
                    await self._wait_idle(engine.url, 120, 0.5)
                for tags in tag_sets:
                    await self._expect(engine.url, "POST", path, engine_api.memory_occupation_body(tags))

        await asyncio.gather(*(one(e) for e in self._live()))

    # ---- introspection and shutdown ------------------------------------------------------------

    @property
    def router_url(self) -> str:
        return self.router.url

    def engine_urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def engine_info(self) -> list[dict[str, Any]]:
        infos = ray.get([e.actor.info.remote() for e in self.engines])
        return [
            {**info, "state": e.state, "restarts": e.restarts}
            for e, info in zip(self.engines, infos, strict=True)
        ]

    def engine_gpu_memory_gb(self) -> list[float]:
        """GPU memory each engine's server holds (GB; -1 where NVML cannot tell)."""
        return [float(x) for x in ray.get([e.actor.gpu_memory_gb.remote() for e in self.engines])]

    def kill_engine_process(self, index: int) -> None:
        """Hard-kill engine ``index``'s server (fault injection for tests and drills)."""
        ray.get(self.engines[index].actor.kill.remote())

    def check_failed(self) -> None:
        """Raise the error that failed the rollout side, if any (the driver may poll this)."""
        if self._fatal is not None:
            raise self._fatal

    def shutdown(self) -> None:
        """Stop health checks, the router and every engine (server and actor); idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)

        async def stop_tasks() -> None:
            # Every task on the loop, not only the tracked ones: a caller interrupted mid-call (SIGTERM
            # in the driver) leaves its coroutine running here. Each is awaited before the session
            # closes, so none fails later with "Session is closed" and prints a traceback at exit,
            # after the runtime's last line (the operator reads that line as the reason).
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
            for task in pending:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: asyncio would log it at exit otherwise
            if self._session is not None:
                await self._session.close()

        if self._thread.is_alive():
            try:
                self._submit(stop_tasks()).result(timeout=10)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.warning("rollout manager: stopping tasks: %s", exc)
        self.router.stop()
        refs = [e.actor.shutdown.remote() for e in self.engines]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=15)
        except Exception as exc:  # a dead actor: its server died with it (PDEATHSIG)
            log.warning("rollout manager: engine shutdown: %s", exc)
        for engine in self.engines:
            kill_actor(engine.actor)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> RolloutManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
