"""``/health_generate`` of the real ``hf`` server: a busy engine is alive, a stuck one is not.

Batches run to completion here (SGLang batches continuously), so the one-token probe waits behind a
long batch; like SGLang, the server counts any progress of the engine after the check began as
healthy. Without that, an engine decoding long responses on a loaded CPU failed its check and was
replaced mid-rollout. The server runs over HTTP in the test's own event loop around a tiny
random-weight Qwen2 model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from rljob_runtime import engine_api
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.rollout.hf_engine import HFEngine
from rljob_runtime.rollout.hf_server import HFServer

PROMPT = [1780, 314, 216, 34, 27, 35, 47]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> HFEngine:
    return HFEngine(make_tiny_model(tmp_path_factory.mktemp("qwen") / "m", arch="qwen2", seed=3))


@asynccontextmanager
async def serving(server: HFServer) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            yield f"http://127.0.0.1:{port}", http
    finally:
        await runner.cleanup()


async def running_requests(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/v1/loads") as resp:
        return int((await resp.json())["loads"][0]["num_running_reqs"])


def test_a_probe_behind_a_long_batch_answers_while_the_batch_runs(engine: HFEngine) -> None:
    async def main() -> None:
        async with serving(HFServer(engine, args={})) as (url, http):
            params = engine_api.sampling_params(temperature=0.0, max_new_tokens=100_000, ignore_eos=True)
            long = asyncio.create_task(
                http.post(
                    f"{url}/generate", json={"input_ids": PROMPT, "sampling_params": params, "rid": "long"}
                )
            )
            deadline = time.monotonic() + 30
            while await running_requests(http, url) == 0:
                assert time.monotonic() < deadline, "the long request never ran"
                await asyncio.sleep(0.01)
            began = time.monotonic()
            async with http.get(f"{url}/health_generate") as resp:
                assert resp.status == 200, await resp.text()
            assert time.monotonic() - began < 5
            assert not long.done(), "the batch ended first: the probe proved nothing"
            assert await running_requests(http, url) == 1
            async with http.post(f"{url}/abort_request", json={"rid": "long"}) as resp:
                assert resp.status == 200
            async with await long as resp:
                body = await resp.json()
            assert body["meta_info"]["finish_reason"]["type"] == "abort"

    asyncio.run(asyncio.wait_for(main(), timeout=60))


def test_an_engine_that_makes_no_progress_fails_the_check_and_the_probe_is_dropped(
    engine: HFEngine,
) -> None:
    async def main() -> None:
        server = HFServer(engine, args={}, health_timeout_s=1.0)
        async with serving(server) as (url, http):
            engine.lock.acquire()  # a hung forward pass: the batch cannot step
            try:
                began = time.monotonic()
                async with http.get(f"{url}/health_generate") as resp:
                    assert resp.status == 503
                    assert "no progress in 1 s" in await resp.text()
                assert 1.0 <= time.monotonic() - began < 5
            finally:
                engine.lock.release()
            deadline = time.monotonic() + 10
            while server.futures or server.waiting or server.running:
                assert time.monotonic() < deadline, "the aborted probe stayed queued"
                await asyncio.sleep(0.01)
            async with http.get(f"{url}/health_generate") as resp:  # unstuck: healthy again
                assert resp.status == 200

    asyncio.run(asyncio.wait_for(main(), timeout=60))
