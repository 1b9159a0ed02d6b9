"""One weight update across the serving engines, as the weight transports (``sync/``) see it.

``RolloutManager.updating(version)`` opens it: every serving engine is paused and flushed (SGLang's
``/flush_cache`` answers 400 until the engine is idle: retried), then the transport posts its
transfer requests (``post``: one body to every engine; ``post_each``: a sequence per engine), and on
a clean exit each engine's version moves (``/update_weight_version``) and generation continues. An
engine that dies meanwhile (``EngineGone``) is dropped from the update and replaced afterwards; the
replacement brings it to the new version. A collective transfer (NCCL) cannot go on without every
member: on the first loss the transport's ``on_lost`` aborts the sender, and every engine still
waiting in the broadcast is dropped too (it would wait for the group's timeout otherwise).

A relaunched engine is brought up to date through the same object (``fresh``): it is not registered
and idle, so there is nothing to pause, flush or continue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from .. import engine_api
from .errors import EngineGone, WeightUpdateError

Body = dict[str, Any]
FLUSH_ATTEMPTS, FLUSH_BACKOFF_S = 120, 0.5  # an engine finishing its last requests: up to a minute
T = TypeVar("T")


class EngineRequests(Protocol):
    """The engines' client as an update uses it (``client.EngineClient``)."""

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's loop and wait."""
        ...

    async def request(
        self, url: str, method: str, path: str, body: Any = None, timeout: float = 600.0
    ) -> tuple[int, Any]: ...

    async def wait_idle(self, url: str, attempts: int, backoff_s: float) -> None: ...


class EngineUpdate:
    def __init__(
        self, client: EngineRequests, urls: Sequence[str], tp_sizes: dict[str, int], *, fresh: bool
    ) -> None:
        self._client = client
        self.urls = list(urls)
        self.tp_sizes = dict(tp_sizes)
        self.fresh = fresh
        self.lost: dict[str, str] = {}  # url -> why
        self.seconds: dict[str, float] = {}  # the frame's own phases: pause_flush, finish

    @property
    def live(self) -> list[str]:
        return [u for u in self.urls if u not in self.lost]

    # ---- what the transports call (from a thread other than the client's loop) --------------------

    def post(self, path: str, body: Body | Callable[[str], Body]) -> None:
        """``body`` (or ``body(url)``) to every live engine at once; returns when all answered."""
        self._client.call(self._post_all(path, body))

    def post_each(
        self,
        path: str,
        bodies: Sequence[Body],
        *,
        collective: bool = False,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """``bodies`` in order to each live engine, the engines at once. ``collective``: the requests
        are one broadcast's receivers; see the module docstring for ``on_lost``."""
        self._client.call(self._post_each(path, list(bodies), collective, on_lost))

    # ---- on the client's loop -------------------------------------------------------------------

    async def _send(self, url: str, path: str, body: Body) -> None:
        status, answer = await self._client.request(url, "POST", path, body)
        if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
            raise WeightUpdateError(f"POST {url}{path}: HTTP {status} {str(answer)[:500]}")

    def _settle(self, urls: Sequence[str], results: Sequence[BaseException | None]) -> None:
        errors = []
        for url, result in zip(urls, results, strict=True):
            if isinstance(result, EngineGone):
                self.lost.setdefault(url, str(result))
            elif isinstance(result, BaseException):
                errors.append(f"{url}: {result}")
        if self.fresh and self.lost:
            raise EngineGone("; ".join(self.lost.values()))
        if errors:
            raise WeightUpdateError("; ".join(errors))

    async def _post_all(self, path: str, body: Body | Callable[[str], Body]) -> None:
        urls = self.live
        results = await asyncio.gather(
            *(self._send(u, path, body(u) if callable(body) else body) for u in urls), return_exceptions=True
        )
        self._settle(urls, [r if isinstance(r, BaseException) else None for r in results])

    async def _post_each(
        self, path: str, bodies: list[Body], collective: bool, on_lost: Callable[[], None] | None
    ) -> None:
        urls = self.live

        async def one(url: str) -> None:
            for body in bodies:
                await self._send(url, path, body)

        tasks = {asyncio.create_task(one(u)): u for u in urls}
        results: dict[str, BaseException | None] = {}
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                results[tasks[task]] = task.exception()
            if collective and any(e is not None for e in results.values()):
                # a member left or refused: the broadcast cannot complete. Unblock the sender and give
                # up on the receivers still in it (they would wait for the group's timeout).
                if on_lost is not None:
                    await asyncio.to_thread(on_lost)
                for task in pending:
                    task.cancel()
                    results[tasks[task]] = EngineGone(f"{tasks[task]}: stuck in a broadcast a peer left")
                await asyncio.gather(*pending, return_exceptions=True)
                pending = set()
        self._settle(urls, [results[u] for u in urls])

    async def begin(self) -> None:
        """Pause and flush every engine (not for a fresh engine)."""
        if self.fresh:
            return
        started = time.perf_counter()

        async def prepare(url: str) -> None:
            await self._send(url, "/pause_generation", engine_api.pause_body())
            await self._client.wait_idle(url, FLUSH_ATTEMPTS, FLUSH_BACKOFF_S)

        results = await asyncio.gather(*(prepare(u) for u in self.urls), return_exceptions=True)
        self.seconds["pause_flush"] = time.perf_counter() - started
        self._settle(self.urls, [r if isinstance(r, BaseException) else None for r in results])

    async def end(self, version: str | None) -> None:
        """Set ``version`` (when the transfer succeeded) and let generation continue."""

        async def finish(url: str) -> None:
            if version is not None:
                await self._send(
                    url, "/update_weight_version", engine_api.update_weight_version_body(version)
                )
            if not self.fresh:
                await self._send(url, "/continue_generation", {})

        started, urls = time.perf_counter(), self.live
        results = await asyncio.gather(*(finish(u) for u in urls), return_exceptions=True)
        self.seconds["finish"] = time.perf_counter() - started
        self._settle(urls, [r if isinstance(r, BaseException) else None for r in results])
