"""Partial rollout against the real ``hf`` server: an aborted greedy response, continued from prompt +
partial output, ends with exactly the tokens of an uninterrupted one, and records which weight version
made each token.

The server is ``HFServer`` served over HTTP on a free port in the test's own event loop (the engine
decodes in the server's worker thread), around one tiny random-weight Qwen2 model per module. Aborts
land mid-request deterministically: the tests wait until ``/v1/loads`` shows the running request
holding some output before they abort or pause.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from rljob_runtime import engine_api
from rljob_runtime.data.sample import Sample, Status, stale_token_mask
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.rollout.generate import RetryPolicy, generate_one, generate_samples
from rljob_runtime.rollout.hf_engine import HFEngine, Request, SamplingParams
from rljob_runtime.rollout.hf_server import HFServer

PROMPT = [1780, 314, 216, 34, 27, 35, 47]  # "What is 2+3?" in SmolLM2's tokenizer
N = 64  # about a second of decoding on 2 CPU cores: room to abort mid-request
AFTER = 4  # abort once the request holds at least this many tokens
PARAMS = engine_api.sampling_params(temperature=0.0, max_new_tokens=N, ignore_eos=True)
RETRY = RetryPolicy(max_attempts=3, backoff_s=0.01)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> HFEngine:
    return HFEngine(make_tiny_model(tmp_path_factory.mktemp("qwen") / "m", arch="qwen2", seed=3))


@pytest.fixture(scope="module")
def reference(engine: HFEngine) -> Request:
    """The uninterrupted greedy response, decoded by the engine in one go."""
    req = Request(
        rid="reference",
        prompt_ids=list(PROMPT),
        params=SamplingParams.from_json(PARAMS),
        return_logprob=True,
        generator=torch.Generator(),
    )
    engine.run_batch([req], should_yield=lambda: False, on_finish=lambda _r: None, weight_version=lambda: "")
    assert len(req.output_ids) == N
    return req


@asynccontextmanager
async def serving(engine: HFEngine) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    runner = web.AppRunner(HFServer(engine, args={}).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            yield f"http://127.0.0.1:{port}", http
    finally:
        await runner.cleanup()


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()


async def wait_loads(
    http: aiohttp.ClientSession, url: str, what: str, check: Callable[[dict[str, Any]], bool]
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with http.get(f"{url}/v1/loads") as resp:
            if check((await resp.json())["loads"][0]):
                return
        await asyncio.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


async def running_with_output(http: aiohttp.ClientSession, url: str) -> None:
    await wait_loads(
        http,
        url,
        f"a running request with {AFTER} tokens",
        lambda load: load["num_running_reqs"] == 1 and load["num_used_tokens"] >= len(PROMPT) + AFTER,
    )


def run(engine: HFEngine, scenario: Callable[[str, aiohttp.ClientSession], Awaitable[Sample]]) -> Sample:
    async def main() -> Sample:
        async with serving(engine) as (url, http):
            return await asyncio.wait_for(scenario(url, http), timeout=60)

    return asyncio.run(main())


@pytest.mark.parametrize("new_version", [None, "1"])
def test_an_aborted_greedy_response_continues_to_the_uninterrupted_tokens(
    engine: HFEngine, reference: Request, new_version: str | None
) -> None:
    """abort_request mid-decode (cancelling: the abort is final, its tokens kept), optionally a new
    weight version, then ``generate_one`` continues the resumable sample."""
    kept: dict[str, Any] = {}

    async def scenario(url: str, http: aiohttp.ClientSession) -> Sample:
        sample = Sample(index=0, prompt_ids=list(PROMPT))
        task = asyncio.create_task(
            generate_one(http, url, sample, PARAMS, retry=RETRY, cancelled=lambda: True)
        )
        await running_with_output(http, url)
        await post(http, f"{url}/abort_request", engine_api.abort_body())
        await task
        kept.update(
            status=sample.status,
            ids=list(sample.response_ids),
            logprobs=list(sample.rollout_logprobs or []),
            labels=list(sample.weight_versions),
            versions=list(sample.token_versions),
        )
        if new_version is not None:
            await post(
                http, f"{url}/update_weight_version", engine_api.update_weight_version_body(new_version)
            )
        return await generate_one(http, url, sample, PARAMS, retry=RETRY)

    sample = run(engine, scenario)
    k = len(kept["ids"])
    # the abort answered the tokens so far with their logprobs and the serving version
    assert kept["status"] is Status.ABORTED and AFTER <= k < N
    assert kept["ids"] == reference.output_ids[:k] and len(kept["logprobs"]) == k
    assert kept["labels"] == ["default"] and kept["versions"] == [0] * k
    # continued: the uninterrupted greedy tokens, from two answers
    assert sample.status is Status.TRUNCATED and sample.response_length == N
    assert sample.response_ids == reference.output_ids
    assert sample.rollout_logprobs == pytest.approx(reference.output_logprobs, abs=1e-4)
    assert sample.metadata["rollout_segments"] == 2
    if new_version is None:
        assert sample.token_versions == [0] * N and sample.weight_versions == ["default"]
        assert stale_token_mask(sample) == [1] * N
    else:
        assert sample.token_versions == [0] * k + [1] * (N - k)
        assert sample.weight_versions == ["default", "1"]
        assert stale_token_mask(sample) == [0] * k + [1] * (N - k)


@pytest.mark.parametrize("continue_aborted", [True, False])
def test_a_weight_update_pause_continues_or_restarts_the_response(
    engine: HFEngine, reference: Request, continue_aborted: bool
) -> None:
    """``/pause_generation`` (mode abort) mid-request, as a weight update does; the retry waits in the
    paused engine; the version moves to "1"; ``/continue_generation``."""

    async def scenario(url: str, http: aiohttp.ClientSession) -> Sample:
        sample = Sample(index=0, prompt_ids=list(PROMPT))
        task = asyncio.create_task(
            generate_samples(
                url, [sample], PARAMS, retry=RETRY, session=http, continue_aborted=continue_aborted
            )
        )
        await running_with_output(http, url)
        await post(http, f"{url}/pause_generation", engine_api.pause_body("abort"))
        await wait_loads(
            http, url, "the retry held by the paused engine", lambda load: load["num_waiting_reqs"] == 1
        )
        await post(http, f"{url}/update_weight_version", engine_api.update_weight_version_body("1"))
        await post(http, f"{url}/continue_generation", {})
        await task
        return sample

    sample = run(engine, scenario)
    assert sample.status is Status.TRUNCATED and sample.response_ids == reference.output_ids
    assert sample.rollout_logprobs == pytest.approx(reference.output_logprobs, abs=1e-4)
    assert sample.metadata["rollout_tries"] == 2
    if continue_aborted:
        k = sample.token_versions.count(0)
        assert AFTER <= k < N and sample.token_versions == [0] * k + [1] * (N - k)
        assert sample.weight_versions == ["default", "1"] and sample.metadata["rollout_segments"] == 2
    else:  # resent from scratch: every token from the new version
        assert sample.token_versions == [1] * N and sample.weight_versions == ["1"]
        assert sample.metadata["rollout_segments"] == 1
