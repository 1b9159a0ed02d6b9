"""Pure parts of rollout generation: request bodies, response mapping, statuses, the retry policy,
and the retry loop against a scripted local HTTP server (no model, no router)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rljob_api.spec_rollout import RolloutSpec
from rljob_runtime import engine_api
from rljob_runtime.data.sample import Sample, Status, stale_token_mask
from rljob_runtime.rollout.generate import (
    GenerationError,
    RetryPolicy,
    apply_response,
    generate_one,
    generate_samples,
    request_body,
    sampling_params_from_spec,
    status_from_finish_reason,
)


def answer(ids: list[int], kind: str = "length", version: str = "3") -> dict[str, Any]:
    return {
        "text": "".join(f"<{t}>" for t in ids),
        "output_ids": ids,
        "meta_info": {
            "finish_reason": {"type": kind},
            "weight_version": version,
            "output_token_logprobs": [[-0.1 * (i + 1), t, None] for i, t in enumerate(ids)],
        },
    }


def test_sampling_params_follow_the_rollout_spec() -> None:
    spec = RolloutSpec.model_validate(
        {
            "temperature": 0.7,
            "topP": 0.9,
            "topK": 20,
            "maxResponseLen": 33,
            "stop": ["\n\n"],
            "stopTokenIds": [2],
        }
    )
    params = sampling_params_from_spec(spec)
    assert params == engine_api.sampling_params(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33, stop=["\n\n"], stop_token_ids=[2]
    )
    assert set(params) <= engine_api.SAMPLING_PARAM_FIELDS
    # empty stop lists are left out; overrides win
    plain = sampling_params_from_spec(RolloutSpec(), temperature=0.0, ignore_eos=True)
    assert "stop" not in plain and "stop_token_ids" not in plain
    assert plain["temperature"] == 0.0 and plain["ignore_eos"] is True and plain["max_new_tokens"] == 1024


def test_request_body_uses_prompt_ids_and_logprobs() -> None:
    params = engine_api.sampling_params(max_new_tokens=4)
    body = request_body(Sample(index=0, prompt="hi", prompt_ids=[5, 6, 7]), params)
    assert body == engine_api.generate_body(input_ids=[5, 6, 7], params=params, return_logprob=True)
    assert body["return_logprob"] is True and "text" not in body
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        request_body(Sample(index=3, prompt="hi"), params)


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("stop", Status.COMPLETED),
        ("length", Status.TRUNCATED),
        ("abort", Status.ABORTED),
        (None, Status.FAILED),
        ("weird", Status.FAILED),
    ],
)
def test_finish_reason_to_status(kind: str | None, status: Status) -> None:
    assert status_from_finish_reason(kind) is status


def test_apply_response_aligns_ids_and_logprobs() -> None:
    sample = Sample(index=1, prompt_ids=[1, 2], metadata={"keep": 1})
    apply_response(sample, answer([10, 11, 12], "stop", "7"))
    assert sample.response_ids == [10, 11, 12] and sample.response_length == 3
    assert sample.rollout_logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert sample.response == "<10><11><12>"
    assert sample.status is Status.COMPLETED and sample.weight_versions == ["7"]
    assert sample.token_versions == [7, 7, 7]
    assert sample.metadata == {"keep": 1, "finish_reason": "stop", "rollout_segments": 1}
    assert sample.tokens == [1, 2, 10, 11, 12]
    # without logprobs: output_ids, no logprobs; a bare-string finish reason (older SGLang)
    bare = {"text": "x", "output_ids": [4], "meta_info": {"finish_reason": "length"}}
    apply_response(sample, bare)
    assert sample.response_ids == [4] and sample.rollout_logprobs is None
    assert sample.status is Status.TRUNCATED and sample.weight_versions == []
    assert sample.token_versions == []
    # a label that is not ours: kept as a label, no per-token versions
    apply_response(sample, answer([1, 2], "stop", "custom-v2"))
    assert sample.weight_versions == ["custom-v2"] and sample.token_versions == []


def _partial(ids: list[int], status: Status = Status.ABORTED, version: int = 0) -> Sample:
    return Sample(
        index=2,
        prompt_ids=[5, 6],
        response="".join(f"<{t}>" for t in ids),
        response_ids=list(ids),
        response_length=len(ids),
        status=status,
        rollout_logprobs=[-1.0] * len(ids),
        weight_versions=["default" if version == 0 else str(version)] if ids else [],
        token_versions=[version] * len(ids),
        metadata={"rollout_segments": 1},
    )


def test_request_body_continues_a_partial_response_within_the_budget() -> None:
    params = engine_api.sampling_params(max_new_tokens=5, temperature=0.0)
    shared = dict(params)
    body = request_body(_partial([10, 11]), params)
    assert body["input_ids"] == [5, 6, 10, 11] and body["sampling_params"]["max_new_tokens"] == 3
    assert {k: v for k, v in body["sampling_params"].items() if k != "max_new_tokens"} == {
        k: v for k, v in params.items() if k != "max_new_tokens"
    }
    assert params == shared  # the rollout's shared params are not changed
    assert request_body(_partial([10, 11], Status.PENDING), params)["input_ids"] == [5, 6, 10, 11]
    # nothing left: 0 (generate_one then sends nothing)
    assert request_body(_partial([1] * 7), params)["sampling_params"]["max_new_tokens"] == 0
    # finished responses and aborts without tokens start from the prompt
    for sample in (_partial([10, 11], Status.COMPLETED), _partial([10], Status.TRUNCATED), _partial([])):
        assert request_body(sample, params) == request_body(Sample(index=2, prompt_ids=[5, 6]), params)
    # no budget in the params: none to reduce
    unbounded = {k: v for k, v in params.items() if k != "max_new_tokens"}
    assert "max_new_tokens" not in request_body(_partial([10]), unbounded)["sampling_params"]


def test_apply_response_appends_a_continued_segment() -> None:
    sample = _partial([10, 11])
    sample.metadata["keep"] = 1
    apply_response(sample, answer([12, 13, 14], "stop", "4"))
    assert sample.response_ids == [10, 11, 12, 13, 14] and sample.response_length == 5
    assert sample.rollout_logprobs == pytest.approx([-1.0, -1.0, -0.1, -0.2, -0.3])
    assert sample.response == "<10><11><12><13><14>"
    assert sample.token_versions == [0, 0, 4, 4, 4] and sample.weight_versions == ["default", "4"]
    assert sample.status is Status.COMPLETED and sample.loss_mask is None
    assert sample.metadata == {"keep": 1, "finish_reason": "stop", "rollout_segments": 2}
    assert stale_token_mask(sample) == [0, 0, 1, 1, 1]
    # a finished sample is not continued: the next answer replaces it
    apply_response(sample, answer([20], "length", "4"))
    assert sample.response_ids == [20] and sample.token_versions == [4]
    assert sample.metadata["rollout_segments"] == 1


def test_a_continued_segment_aborted_again_stays_resumable() -> None:
    sample = _partial([10])
    apply_response(sample, answer([11], "abort", "1"))
    apply_response(sample, answer([], "abort", "2"))  # aborted before it ran: adds nothing
    assert sample.resumable and sample.response_ids == [10, 11] and sample.status is Status.ABORTED
    assert sample.token_versions == [0, 1] and sample.weight_versions == ["default", "1"]
    assert sample.metadata["rollout_segments"] == 3


def test_appending_what_cannot_be_aligned_drops_it() -> None:
    # no logprobs on either side: none for the whole response
    sample = _partial([10])
    sample.rollout_logprobs = None
    apply_response(sample, answer([11], "stop"))
    assert sample.rollout_logprobs is None and sample.response_ids == [10, 11]
    sample = _partial([10])
    apply_response(sample, {"text": "", "output_ids": [11], "meta_info": {"finish_reason": "length"}})
    assert sample.rollout_logprobs is None and sample.response_ids == [10, 11]
    # an unknown version on either side: no per-token versions
    assert sample.token_versions == [] and sample.weight_versions == ["default"]
    sample = _partial([10])
    sample.token_versions = []
    apply_response(sample, answer([11], "stop", "3"))
    assert sample.token_versions == [] and sample.weight_versions == ["default", "3"]
    # an explicit loss mask grows with the response
    sample = _partial([10])
    sample.loss_mask = [0]
    apply_response(sample, answer([11, 12], "stop", "3"))
    assert sample.loss_mask == [0, 1, 1] and stale_token_mask(sample) == [0, 1, 1]


def test_retry_policy_delays_and_validation() -> None:
    slime = RetryPolicy()
    assert (slime.max_attempts, slime.delay(1), slime.delay(59)) == (60, 1.0, 1.0)
    expo = RetryPolicy(backoff_s=0.5, backoff_multiplier=2.0, max_backoff_s=3.0)
    assert [expo.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(backoff_multiplier=0.5)


# ---- the retry loop against a scripted server -------------------------------------------------------

Script = Callable[[int, dict[str, Any]], web.StreamResponse]


async def _with_server(script: Script, run: Callable[[str], Any]) -> tuple[Any, int]:
    calls = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        return script(calls, await request.json())

    app = web.Application()
    app.router.add_post("/generate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        return await run(f"http://127.0.0.1:{port}"), calls
    finally:
        await runner.cleanup()


FAST = RetryPolicy(max_attempts=4, backoff_s=0.01)
PARAMS = engine_api.sampling_params(max_new_tokens=3)


def _samples(n: int) -> list[Sample]:
    return [Sample(index=i, prompt_ids=[i + 1, 2]) for i in range(n)]


def test_errors_and_weight_update_aborts_are_retried_until_success() -> None:
    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        if call == 1:
            return web.json_response({"error": "upstream gone"}, status=500)
        if call == 2:
            return web.json_response({"error": "no workers"}, status=503)
        if call == 3:
            return web.json_response(answer([9], "abort"))  # paused for a weight update
        return web.json_response(answer(body["input_ids"][::-1], "stop"))

    samples = _samples(1)
    result, calls = asyncio.run(
        _with_server(script, lambda url: generate_samples(url, samples, PARAMS, retry=FAST))
    )
    assert calls == 4 and result is not samples and result == samples
    assert samples[0].response_ids == [2, 1] and samples[0].status is Status.COMPLETED
    assert samples[0].metadata["rollout_tries"] == 4


def test_exhausted_retries_raise_with_the_last_error() -> None:
    samples = _samples(3)

    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        if body["input_ids"][0] == 2:
            return web.json_response({"error": "always down"}, status=502)
        return web.json_response(answer([1]))

    with pytest.raises(GenerationError, match=r"sample 1: 4 tries failed, the last with HTTP 502"):
        asyncio.run(_with_server(script, lambda url: generate_samples(url, samples, PARAMS, retry=FAST)))


def test_failures_while_the_only_engine_is_replaced_do_not_use_up_the_retries() -> None:
    """An SGLang relaunch outlasts the retries: while the manager's ``hold`` says no engine serves
    (and it waited for the replacement), a failed try is not counted."""
    waits: list[int] = []

    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        if call <= 6:
            return web.json_response({"error": "no workers"}, status=503)
        return web.json_response(answer([5]))

    async def hold() -> bool:
        waits.append(1)
        return len(waits) <= 5  # a replacement was under way for the first five failures

    samples = _samples(1)
    asyncio.run(
        _with_server(
            script,
            lambda url: generate_samples(url, samples, PARAMS, retry=RetryPolicy(max_attempts=2), hold=hold),
        )
    )
    assert samples[0].response_ids == [5] and len(waits) == 6  # 6 failures, only the last one counted


def test_client_errors_fail_at_once_and_connection_errors_are_retried() -> None:
    def bad(call: int, body: dict[str, Any]) -> web.StreamResponse:
        return web.json_response({"error": "bad input_ids"}, status=400)

    with pytest.raises(GenerationError, match="HTTP 400"):
        asyncio.run(_with_server(bad, lambda url: generate_samples(url, _samples(1), PARAMS, retry=FAST)))

    async def nobody_listens() -> None:
        from rljob_runtime.net import free_port

        await generate_samples(f"http://127.0.0.1:{free_port()}", _samples(1), PARAMS, retry=FAST)

    with pytest.raises(GenerationError, match="4 tries failed, the last with ClientConnectorError"):
        asyncio.run(nobody_listens())


def test_aborts_are_final_when_the_caller_cancels_and_bounded_otherwise() -> None:
    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        return web.json_response(answer([7, 8], "abort"))

    samples = _samples(2)
    asyncio.run(
        _with_server(
            script, lambda url: generate_samples(url, samples, PARAMS, retry=FAST, cancelled=lambda: True)
        )
    )
    assert [s.status for s in samples] == [Status.ABORTED, Status.ABORTED]
    assert samples[0].response_ids == [7, 8]
    bounded = RetryPolicy(max_attempts=2, max_abort_retries=2)
    with pytest.raises(GenerationError, match="aborted 3 times"):
        asyncio.run(
            _with_server(script, lambda url: generate_samples(url, _samples(1), PARAMS, retry=bounded))
        )


def test_continue_aborted_keeps_the_partial_output_and_continues_it() -> None:
    bodies: list[dict[str, Any]] = []

    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        bodies.append(body)
        if call <= 2:
            return web.json_response(answer([7 + call], "abort", "default" if call == 1 else "1"))
        return web.json_response(answer([20], "length", "2"))

    samples = _samples(1)
    asyncio.run(
        _with_server(
            script,
            lambda url: generate_samples(url, samples, PARAMS, retry=FAST, continue_aborted=True),
        )
    )
    (sample,) = samples
    assert [b["input_ids"] for b in bodies] == [[1, 2], [1, 2, 8], [1, 2, 8, 9]]
    assert [b["sampling_params"]["max_new_tokens"] for b in bodies] == [3, 2, 1]
    assert sample.response_ids == [8, 9, 20] and sample.status is Status.TRUNCATED
    assert sample.token_versions == [0, 1, 2] and sample.weight_versions == ["default", "1", "2"]
    assert sample.metadata["rollout_segments"] == 3 and sample.metadata["rollout_tries"] == 3
    assert PARAMS["max_new_tokens"] == 3


def _always_abort(call: int, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response(answer([call], "abort"))


def test_continued_aborts_are_bounded() -> None:
    bounded = RetryPolicy(max_attempts=2, max_abort_retries=1)
    params = engine_api.sampling_params(max_new_tokens=9)
    with pytest.raises(GenerationError, match="sample 0: aborted 2 times"):
        asyncio.run(
            _with_server(
                _always_abort,
                lambda url: generate_samples(url, _samples(1), params, retry=bounded, continue_aborted=True),
            )
        )


@pytest.mark.parametrize("continue_aborted", [False, True])
def test_an_abort_while_cancelling_is_final_and_keeps_the_partial_output(continue_aborted: bool) -> None:
    samples = _samples(1)

    async def cancelling(url: str) -> list[Sample]:
        return await generate_samples(
            url, samples, PARAMS, retry=FAST, cancelled=lambda: True, continue_aborted=continue_aborted
        )

    _, calls = asyncio.run(_with_server(_always_abort, cancelling))
    assert calls == 1 and samples[0].status is Status.ABORTED and samples[0].response_ids == [1]
    assert samples[0].rollout_logprobs == [-0.1] and samples[0].resumable


def test_a_partial_response_that_used_the_budget_ends_truncated_without_a_request() -> None:
    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        raise AssertionError("no request expected")

    sample = Sample(index=0, prompt_ids=[1], response_ids=[4, 5, 6], response_length=3, status=Status.ABORTED)

    async def run(url: str) -> Sample:
        async with aiohttp.ClientSession() as http:
            return await generate_one(http, url, sample, PARAMS, retry=FAST)

    _, calls = asyncio.run(_with_server(script, run))
    assert calls == 0 and sample.status is Status.TRUNCATED and sample.response_ids == [4, 5, 6]
    assert sample.metadata["finish_reason"] == "length" and sample.metadata["rollout_tries"] == 0


def test_concurrency_is_bounded() -> None:
    in_flight = peak = 0

    async def run(url: str) -> list[Sample]:
        return await generate_samples(url, _samples(12), PARAMS, concurrency=3, retry=FAST)

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return web.json_response(answer([1]))

    async def main() -> list[Sample]:
        app = web.Application()
        app.router.add_post("/generate", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await run(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    out = asyncio.run(main())
    assert len(out) == 12 and all(s.status is Status.TRUNCATED for s in out)
    assert peak == 3


def test_a_choice_of_engine_per_sample_is_asked_again_at_every_try() -> None:
    """training.routingReplay bypasses the router (it drops return_routed_experts): each sample's
    request goes to the engine ``url(sample)`` names, asked again after a failed try (a replaced
    engine has a new address), with return_routed_experts; the answer's record lands in the sample."""
    record = "AQAAAAIAAAA="
    bodies: list[dict[str, Any]] = []

    def script(call: int, body: dict[str, Any]) -> web.StreamResponse:
        bodies.append(body)
        if call == 1:
            return web.json_response({"error": "engine going away"}, status=503)
        reply = answer([4])
        reply["meta_info"]["routed_experts"] = record
        return web.json_response(reply)

    samples = [Sample(index=i, group_index=i // 2, prompt_ids=[i + 1, 2]) for i in range(2)]
    asked: list[tuple[int | None, str]] = []

    async def run(url: str) -> list[Sample]:
        def engine_for(sample: Sample) -> str:
            # a dead address first (the engine being replaced), the live one after
            target = url if asked else "http://127.0.0.1:9"
            asked.append((sample.index, target))
            return target

        return await generate_samples(
            engine_for, samples, PARAMS, retry=FAST, concurrency=1, routed_experts=True
        )

    asyncio.run(_with_server(script, run))
    assert [index for index, _ in asked] == [0, 0, 0, 1]  # sample 0: dead address, 503, then served
    assert all(body["return_routed_experts"] is True for body in bodies)
    assert all(s.rollout_routed_experts == record and s.response_ids == [4] for s in samples)
