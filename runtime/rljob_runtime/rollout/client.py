"""The rollout side's HTTP client of the router and the engines, on an asyncio loop of its own.

The driver loop is synchronous; ``EngineClient`` runs a loop on a thread of its own (``submit``,
``call``, ``wait``) for generation, the engines' requests and, through the fleet, the health checks.
It holds what every request needs: one aiohttp session, the failure that ends the rollout side
(``fail``: raised by the next call, and by the generations it cancels), and the weight version the
engines serve.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

from .. import engine_api
from ..data.sample import Sample
from ..models.resolve import resolve_tokenizer
from .custom_generate import Hook, generate_samples_with_hook, load_hook
from .errors import EngineGone, RolloutError, WeightUpdateError
from .generate import Hold, RetryPolicy, generate_samples, sampling_params_from_spec

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

log = logging.getLogger("rljob.rollout.manager")

T = TypeVar("T")


class EngineClient:
    """Requests to the router and the engines, run on the client's loop; see the module docstring."""

    def __init__(
        self,
        *,
        spec: RLTrainingJobSpec,
        router_url: str,
        retry: RetryPolicy,
        concurrency: int,
        model_path: str | Path | None,
        on_interrupt: Callable[[], None],
    ) -> None:
        """``on_interrupt``: what Ctrl-C while waiting for the loop stops (the whole rollout side)."""
        self.spec = spec
        self.router_url = router_url
        # training.routingReplay: each sample's engine, asked directly (the pinned sglang-router drops
        # return_routed_experts from what it forwards); the manager sets it from the fleet
        self.engine_for: Callable[[Sample], str] | None = None
        self.retry = retry
        self.concurrency = concurrency
        self.model_path = str(model_path) if model_path is not None else None
        self._on_interrupt = on_interrupt
        self.weight_version = engine_api.DEFAULT_WEIGHT_VERSION
        self.fatal: BaseException | None = None
        self.closed = False
        self._cancelling = False
        self._generations: set[asyncio.Task[Any]] = set()
        self._hook: Hook | None = None  # rollout.customGenerate, loaded on first use
        self._tokenizer: Any = None
        self._hook_lock = threading.Lock()  # generate_async may be called from several driver threads
        self._session: aiohttp.ClientSession | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-manager", daemon=True)
        self._thread.start()

    # ---- the loop thread ------------------------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's loop and wait."""
        return self.wait(self.submit(coro))

    def wait(self, future: concurrent.futures.Future[T]) -> T:
        """Wait for a loop future; Ctrl-C shuts everything down, a fatal error is raised as itself."""
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            self._on_interrupt()
            raise
        except concurrent.futures.CancelledError:
            self.raise_if_failed()
            raise

    def raise_if_failed(self) -> None:
        if self.fatal is not None:
            raise self.fatal
        if self.closed:
            raise RolloutError("the rollout manager is shut down")

    def fail(self, exc: BaseException) -> None:
        """The rollout side failed: ``exc`` is raised by every call from now on (the first one wins)."""
        if self.fatal is None:
            self.fatal = exc
            log.error("rollout failed: %s", exc)
        for task in list(self._generations):
            task.cancel()

    # ---- requests -------------------------------------------------------------------------------

    async def http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # no connection cap of aiohttp's own (100 by default): ``concurrency`` bounds the requests,
            # and a rollout's 256 requests must all reach SGLang to fill its batch
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def request(
        self, url: str, method: str, path: str, body: Any = None, timeout: float = 600.0
    ) -> tuple[int, Any]:
        session = await self.http()
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

    async def expect(self, url: str, method: str, path: str, body: Any) -> Any:
        """``request``, and a ``WeightUpdateError`` unless it answered 200 without ``success: false``."""
        status, answer = await self.request(url, method, path, body)
        if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
            raise WeightUpdateError(f"{method} {url}{path}: HTTP {status} {answer}")
        return answer

    async def running_capacity(self, url: str) -> int | None:
        """Requests the engine at ``url`` runs at once (``engine_api.running_capacity``), None when it
        does not answer or does not say."""
        try:
            status, info = await self.request(url, "GET", "/server_info", timeout=30)
        except EngineGone as exc:
            log.warning("rollout: %s", exc)
            return None
        return engine_api.running_capacity(info) if status == 200 else None

    def set_in_flight_limit(self, urls: Sequence[str], fallback_per_engine: int) -> None:
        """Requests in flight at once through the router: what the engines at ``urls`` run at once,
        summed (``fallback_per_engine`` for an engine that does not say). Fewer leave part of an
        engine's batch empty; at 512 per engine the runtime's path made about half of stock SGLang's
        tokens/s on a rollout of 2048 requests that stock sent all at once."""
        capacities = self.call(self._capacities(urls))
        self.concurrency = sum(c or fallback_per_engine for c in capacities)
        log.info(
            "rollout: up to %d requests in flight (engines run %s at once)",
            self.concurrency,
            ", ".join(str(c) if c else f"? (assumed {fallback_per_engine})" for c in capacities),
        )

    async def _capacities(self, urls: Sequence[str]) -> list[int | None]:
        return list(await asyncio.gather(*(self.running_capacity(u) for u in urls)))

    async def wait_idle(self, url: str, attempts: int, backoff_s: float) -> None:
        """``/flush_cache`` until it answers 200: SGLang refuses it while requests run or wait."""
        for _ in range(attempts):
            status, _answer = await self.request(url, "GET", "/flush_cache", timeout=30)
            if status == 200:
                return
            await asyncio.sleep(backoff_s)
        raise WeightUpdateError(f"{url}/flush_cache still refused after {attempts * backoff_s:.0f} s")

    def call_engines(self, path: str, bodies: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """POST ``bodies[url]`` to each engine at once (e.g. joining a weight-update group, which blocks
        until every member joined); the answers, or the exception each raised."""
        return self.call(self._post_many(path, bodies))

    async def _post_many(self, path: str, bodies: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        urls = list(bodies)
        answers = await asyncio.gather(
            *(self.expect(u, "POST", path, bodies[u]) for u in urls), return_exceptions=True
        )
        return dict(zip(urls, answers, strict=True))

    def set_weight_version(self, version: int | str, urls: Sequence[str]) -> None:
        """Label the weights of the engines at ``urls`` (a resumed run's engines loaded its checkpoint)."""
        self.raise_if_failed()
        self.weight_version = str(version)
        body = engine_api.update_weight_version_body(self.weight_version)
        self.call(self._post_all(urls, "/update_weight_version", body))

    async def _post_all(self, urls: Sequence[str], path: str, body: Any) -> None:
        await asyncio.gather(*(self.expect(u, "POST", path, body) for u in urls))

    # ---- generation -----------------------------------------------------------------------------

    def generate_async(
        self, samples: Sequence[Sample], *, hold: Hold | None = None, **sampling_overrides: Any
    ) -> concurrent.futures.Future[list[Sample]]:
        """Fill every sample's response (in place) through the router; the future returns them in
        order. ``sampling_overrides`` change ``rollout``'s sampling params (e.g. ``temperature=0``);
        ``hold``: see ``generate``."""
        self.raise_if_failed()
        params = sampling_params_from_spec(self.spec.rollout, **sampling_overrides)
        self._load_hook()  # here, on the caller's thread: importing must not block the loop
        return self.submit(self._generate(list(samples), params, hold))

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

    async def _generate(
        self, samples: list[Sample], params: dict[str, Any], hold: Hold | None
    ) -> list[Sample]:
        task = asyncio.current_task()
        assert task is not None
        self._generations.add(task)
        self._cancelling = False
        try:
            if self._hook is not None:
                return await generate_samples_with_hook(
                    self._hook,
                    self.router_url,
                    samples,
                    params,
                    tokenizer=self._tokenizer,
                    spec=self.spec,
                    concurrency=self.concurrency,
                    retry=self.retry,
                    cancelled=lambda: self._cancelling,
                    session=await self.http(),
                    hold=hold,
                )
            return await generate_samples(
                self.router_url if self.engine_for is None else self.engine_for,
                samples,
                params,
                concurrency=self.concurrency,
                retry=self.retry,
                cancelled=lambda: self._cancelling,
                # partial rollout: a request a weight update aborts is continued, not restarted
                continue_aborted=self.spec.rollout.partial_rollout,
                routed_experts=self.spec.training.routing_replay,
                session=await self.http(),
                hold=hold,
            )
        except asyncio.CancelledError:
            if self.fatal is not None:
                raise self.fatal from None
            raise
        finally:
            self._generations.discard(task)

    def abort(self, urls: Sequence[str]) -> None:
        """Abort every request in flight on the engines at ``urls``: those samples come back with
        status aborted (not retried)."""
        self._cancelling = True

        async def run() -> None:
            await asyncio.gather(
                *(self.request(u, "POST", "/abort_request", engine_api.abort_body()) for u in urls),
                return_exceptions=True,
            )

        self.call(run())

    # ---- shutdown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every task on the loop, close the session, stop the loop; the client refuses calls."""
        self.closed = True

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
                self.submit(stop_tasks()).result(timeout=10)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.warning("rollout manager: stopping tasks: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
