"""rollout.customGenerate: the hook contract (turn helpers, consistency check, loading, abort and
retry semantics of ctx.generate), the calculator example hook, and prepare refusing a bad hook.

Test doubles (only here): ``CharTokenizer`` (one token per character, so masks can be read back as
text), ``ScriptedContext`` (a GenerateContext whose ``generate`` answers from a script of model
turns, recording each request) and a scripted local HTTP ``/generate`` server for the real
``ctx.generate`` (retries, aborts).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rljob_runtime import engine_api
from rljob_runtime.data.sample import Sample, Status
from rljob_runtime.rollout import custom_generate as cg
from rljob_runtime.rollout.generate import GenerationError, RetryPolicy

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "hooks"))  # as PYTHONPATH=examples/hooks does for the runtime
import calculator_tool  # noqa: E402

PROMPT = [1, 2, 3]


class CharTokenizer:
    """Test double: token id = code point, so any id list decodes back to its exact text."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()


def model_answer(
    text: str, kind: str = "stop", matched: Any = None, version: str = "7", lp: float = -0.5
) -> dict[str, Any]:
    """A /generate answer whose tokens are ``text``'s characters, each with logprob ``lp``."""
    ids = TOK.encode(text)
    reason: dict[str, Any] = {"type": kind}
    if matched is not None:
        reason["matched"] = matched
    return {
        "text": text,
        "output_ids": ids,
        "meta_info": {
            "finish_reason": reason,
            "weight_version": version,
            "output_token_logprobs": [[lp, t, None] for t in ids],
        },
    }


class ScriptedContext(cg.GenerateContext):
    """Test double: ``generate`` returns the scripted answers in order (an exception is raised)."""

    def __init__(self, script: list[dict[str, Any] | BaseException], max_response_len: int = 200) -> None:
        super().__init__(
            session=None, url="http://scripted", tokenizer=TOK, max_response_len=max_response_len
        )  # type: ignore[arg-type]
        self.script = list(script)
        self.calls: list[tuple[list[int], dict[str, Any]]] = []

    async def generate(self, input_ids: Sequence[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((list(input_ids), dict(sampling_params)))
        step = self.script.pop(0)
        if isinstance(step, cg.GenerationAborted):
            self.aborted = True
        if isinstance(step, BaseException):
            raise step
        self.requests += 1
        return step


CALCULATOR = cg.Hook(calculator_tool.generate, "calculator_tool:generate")
PARAMS = engine_api.sampling_params(max_new_tokens=200, stop=["\n\n"])


def run(ctx: cg.GenerateContext, hook: cg.Hook = CALCULATOR, sample: Sample | None = None) -> Sample:
    sample = sample or Sample(index=0, prompt="q", prompt_ids=list(PROMPT))
    return asyncio.run(cg.run_hook(hook, ctx, sample, PARAMS))


def masked_text(sample: Sample, value: int) -> str:
    assert sample.loss_mask is not None
    return TOK.decode([t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m == value])


# ---- the calculator hook with a scripted model ------------------------------------------------------


def test_tool_tokens_are_masked_out_and_logprobs_stay_aligned() -> None:
    first, second = "Let me see. <calc>12*7</calc>", " The answer is 84."
    ctx = ScriptedContext(
        [model_answer(first, matched="</calc>", lp=-0.25), model_answer(second, matched=2, lp=-0.75)]
    )
    sample = run(ctx)
    tool = "<result>84</result>"
    assert sample.response == first + tool + second
    assert TOK.decode(sample.response_ids) == first + tool + second
    assert sample.loss_mask == [1] * len(first) + [0] * len(tool) + [1] * len(second)
    assert masked_text(sample, 0) == tool and masked_text(sample, 1) == first + second
    assert sample.rollout_logprobs == [-0.25] * len(first) + [0.0] * len(tool) + [-0.75] * len(second)
    assert sample.response_length == len(sample.response_ids) == len(sample.rollout_logprobs)
    assert sample.status is Status.COMPLETED and sample.weight_versions == ["7"]
    assert sample.metadata["tool_calls"] == 1 and sample.metadata["rollout_tries"] == 2
    # the second turn continues from the exact tokens so far, within what is left of the budget
    (ids1, params1), (ids2, params2) = ctx.calls
    assert ids1 == PROMPT and ids2 == PROMPT + TOK.encode(first + tool)
    assert params1["stop"] == ["\n\n", "</calc>"] and params1["no_stop_trim"] is True
    assert params1["max_new_tokens"] == 200 and params2["max_new_tokens"] == 200 - len(first + tool)
    assert PARAMS["stop"] == ["\n\n"], "the hook got a copy of the sampling params"


def test_a_result_the_models_last_token_began_is_not_repeated() -> None:
    # SmolLM2 has a '><' token: the turn that writes '</calc>' can end in '</calc><'
    first, second = "<calc>12*7</calc><", " 84"
    ctx = ScriptedContext([model_answer(first, matched="</calc>"), model_answer(second, matched=2)])
    sample = run(ctx)
    assert masked_text(sample, 0) == "result>84</result>"
    assert sample.response == "<calc>12*7</calc><result>84</result> 84"


def test_max_turns_ends_a_sample_that_keeps_calling_the_tool_as_truncated() -> None:
    call = "<calc>1+1</calc>"
    ctx = ScriptedContext([model_answer(call, matched="</calc>") for _ in range(calculator_tool.MAX_TURNS)])
    sample = run(ctx)
    n = calculator_tool.MAX_TURNS
    assert len(ctx.calls) == n and sample.metadata["tool_calls"] == n - 1
    assert sample.status is Status.TRUNCATED
    assert masked_text(sample, 1) == call * n and masked_text(sample, 0) == "<result>2</result>" * (n - 1)


def test_the_response_budget_covers_tool_output() -> None:
    call = "<calc>2*(3+4)</calc>"  # 20 tokens; the result would need 18 more
    ctx = ScriptedContext([model_answer(call, matched="</calc>")], max_response_len=30)
    sample = run(ctx)
    assert len(ctx.calls) == 1 and sample.status is Status.TRUNCATED
    assert sample.response_ids == TOK.encode(call) and sample.loss_mask == [1] * len(call)
    # a model turn cut by max_new_tokens is truncated, not a tool call
    ctx = ScriptedContext([model_answer("<calc>12*", kind="length")])
    sample = run(ctx)
    assert sample.status is Status.TRUNCATED and len(ctx.calls) == 1


def test_a_tool_error_is_shown_to_the_model() -> None:
    ctx = ScriptedContext(
        [model_answer("<calc>__import__('os')</calc>", matched="</calc>"), model_answer(" ok", matched=2)]
    )
    sample = run(ctx)
    assert masked_text(sample, 0) == "<result>error: unexpected character '_'</result>"


def test_an_abort_mid_conversation_ends_the_sample_aborted_and_consistent() -> None:
    ctx = ScriptedContext([model_answer("<calc>3*3</calc>", matched="</calc>"), cg.GenerationAborted("x")])
    sample = run(ctx)
    assert sample.status is Status.ABORTED and sample.metadata["finish_reason"] == "abort"
    assert masked_text(sample, 0) == "<result>9</result>"
    assert len(sample.loss_mask or []) == len(sample.rollout_logprobs or []) == sample.response_length

    async def swallows(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        try:
            await ctx.generate(sample.tokens, params)
        except Exception:
            sample.status = Status.COMPLETED  # wrong: the run knows it was aborted
        return sample

    sample = run(ScriptedContext([cg.GenerationAborted("x")]), cg.Hook(swallows, "t:swallows"))
    assert sample.status is Status.ABORTED


# ---- the consistency check and hook errors ----------------------------------------------------------


def _hook(fn: Callable[..., Any]) -> cg.Hook:
    return cg.Hook(fn, "my_hooks:bad")


def test_an_inconsistent_sample_fails_with_the_hooks_name() -> None:
    async def no_mask(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        cg.append_model_turn(sample, await ctx.generate(sample.tokens, params))
        sample.response_ids += [5, 6]  # tool output appended by hand, without mask and logprobs
        sample.response_length += 2
        return sample

    with pytest.raises(cg.CustomGenerateError) as err:
        run(ScriptedContext([model_answer("hi")]), _hook(no_mask))
    message = str(err.value)
    assert "rollout.customGenerate 'my_hooks:bad' left sample 0 inconsistent" in message
    assert "len(loss_mask) 2 != len(response_ids) 4" in message
    assert "len(rollout_logprobs) 2 != len(response_ids) 4" in message

    async def pending(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        return sample

    with pytest.raises(cg.CustomGenerateError, match="status is still pending"):
        run(ScriptedContext([]), _hook(pending))

    async def bad_mask(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        cg.append_model_turn(sample, await ctx.generate(sample.tokens, params))
        sample.loss_mask = [2] * sample.response_length
        return sample

    with pytest.raises(cg.CustomGenerateError, match="other than 0 and 1"):
        run(ScriptedContext([model_answer("hi")]), _hook(bad_mask))


def test_hook_exceptions_and_wrong_returns_name_the_hook() -> None:
    async def raises(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        raise KeyError("tool")

    with pytest.raises(cg.CustomGenerateError, match=r"'my_hooks:bad' raised KeyError\('tool'\) on sample 0"):
        run(ScriptedContext([]), _hook(raises))

    async def returns_none(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> None:
        return None

    with pytest.raises(cg.CustomGenerateError, match="returned NoneType for sample 0; expected the Sample"):
        run(ScriptedContext([]), _hook(returns_none))

    async def exhausted(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        raise GenerationError("sample 0: 60 tries failed")

    with pytest.raises(GenerationError, match="60 tries failed"):  # passed through as it is
        run(ScriptedContext([]), _hook(exhausted))


def test_a_returned_copy_fills_the_callers_sample() -> None:
    async def copy(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
        out = Sample.from_dict(sample.to_dict())
        cg.append_model_turn(out, await ctx.generate(out.tokens, params))
        return out

    original = Sample(index=0, prompt="q", prompt_ids=list(PROMPT))
    assert run(ScriptedContext([model_answer("yes")]), _hook(copy), original) is original
    assert original.response == "yes" and original.loss_mask == [1, 1, 1]


def test_helpers_keep_the_lists_aligned_from_any_start() -> None:
    sample = Sample(index=0, prompt_ids=[1])
    cg.append_tool_turn(sample, [9, 9], "<env>")  # an environment turn first
    turn = cg.append_model_turn(sample, model_answer("ab", matched="b"))
    assert (turn.ids, turn.text, turn.finish_reason, turn.matched) == ([97, 98], "ab", "stop", "b")
    assert sample.loss_mask == [0, 0, 1, 1] and sample.rollout_logprobs == [0.0, 0.0, -0.5, -0.5]
    assert sample.response == "<env>ab" and sample.response_length == 4
    # a sample filled by plain generate (no explicit mask) continues with an explicit one
    plain = Sample(
        index=1, prompt_ids=[1], response_ids=[4, 5], response_length=2, rollout_logprobs=[-1.0, -1.0]
    )
    cg.append_tool_turn(plain, [6])
    assert plain.loss_mask == [1, 1, 0] and plain.rollout_logprobs == [-1.0, -1.0, 0.0]
    no_logprobs = model_answer("c")
    del no_logprobs["meta_info"]["output_token_logprobs"]
    with pytest.raises(ValueError, match="without logprobs after turns that differ"):
        cg.append_model_turn(plain, no_logprobs)


# ---- loading and checking hooks ---------------------------------------------------------------------


async def good_hook(ctx: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    return sample


def test_check_hook_wants_an_async_function_of_three_arguments() -> None:
    assert cg.check_hook(good_hook, "m:good").fn is good_hook

    async def extra_default(ctx: Any, sample: Sample, params: dict[str, Any], turns: int = 3) -> Sample:
        return sample

    async def star(*args: Any) -> Sample:
        return args[1]

    cg.check_hook(extra_default, "m:f")
    cg.check_hook(star, "m:f")

    def sync(ctx: Any, sample: Sample, params: dict[str, Any]) -> Sample:
        return sample

    async def two(ctx: Any, sample: Sample) -> Sample:
        return sample

    async def four(ctx: Any, sample: Sample, params: dict[str, Any], tools: Any) -> Sample:
        return sample

    async def keyword(ctx: Any, sample: Sample, params: dict[str, Any], *, tools: Any) -> Sample:
        return sample

    with pytest.raises(
        cg.CustomGenerateError, match=r"rollout.customGenerate 'm:sync': must be an async function"
    ):
        cg.check_hook(sync, "m:sync")
    for fn in (two, four, keyword):
        with pytest.raises(cg.CustomGenerateError, match=r"expected \(ctx, sample, sampling_params\)"):
            cg.check_hook(fn, "m:f")


def test_load_hook_names_the_field_and_path() -> None:
    assert cg.load_hook("calculator_tool:generate").fn is calculator_tool.generate
    assert cg.load_hook(f"{__name__}:good_hook").fn is good_hook
    with pytest.raises(
        cg.CustomGenerateError,
        match=r"rollout.customGenerate 'no_such_mod:gen': cannot import module 'no_such_mod'",
    ):
        cg.load_hook("no_such_mod:gen")
    with pytest.raises(
        cg.CustomGenerateError,
        match=r"rollout.customGenerate 'calculator_tool:nope': module 'calculator_tool' has no attribute 'nope'",
    ):
        cg.load_hook("calculator_tool:nope")
    with pytest.raises(cg.CustomGenerateError, match="is a int, not callable"):
        cg.load_hook("calculator_tool:MAX_TURNS")


# ---- the real ctx.generate against a scripted /generate server -------------------------------------

Script = Callable[[int, dict[str, Any]], dict[str, Any] | web.StreamResponse]


async def _serve(script: Script, body: Callable[[str], Any]) -> tuple[Any, list[dict[str, Any]]]:
    requests: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        requests.append(payload)
        answer = script(len(requests), payload)
        return answer if isinstance(answer, web.StreamResponse) else web.json_response(answer)

    app = web.Application()
    app.router.add_post("/generate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        return await body(f"http://127.0.0.1:{port}"), requests
    finally:
        await runner.cleanup()


FAST = RetryPolicy(max_attempts=4, backoff_s=0.01)


def _through_server(script: Script, n: int = 1, **kwargs: Any) -> tuple[list[Sample], list[dict[str, Any]]]:
    samples = [Sample(index=i, prompt="q", prompt_ids=list(PROMPT)) for i in range(n)]

    def body(url: str) -> Any:
        return cg.generate_samples_with_hook(
            CALCULATOR, url, samples, PARAMS, tokenizer=TOK, retry=FAST, **kwargs
        )

    out, requests = asyncio.run(_serve(script, body))
    assert out == samples
    return samples, requests


def test_generate_retries_errors_and_weight_update_aborts_per_turn() -> None:
    turns = [model_answer("<calc>6*7</calc>", matched="</calc>"), model_answer(" 42", matched=2)]

    def script(call: int, body: dict[str, Any]) -> dict[str, Any] | web.StreamResponse:
        if call == 1:
            return web.json_response({"error": "no workers"}, status=503)
        if call == 3:
            return model_answer("<calc>partial", kind="abort")  # a weight update paused the engine
        return turns[0] if len(body["input_ids"]) == len(PROMPT) else turns[1]

    (sample,), requests = _through_server(script)
    assert len(requests) == 4 and sample.metadata["rollout_tries"] == 4
    assert sample.status is Status.COMPLETED and masked_text(sample, 0) == "<result>42</result>"
    assert all(r["return_logprob"] is True and r["sampling_params"]["no_stop_trim"] for r in requests)
    assert requests[3]["input_ids"] == PROMPT + TOK.encode("<calc>6*7</calc><result>42</result>")


def test_when_cancelling_an_abort_is_final_and_no_new_turn_starts() -> None:
    cancelling = False

    def script(call: int, body: dict[str, Any]) -> dict[str, Any]:
        nonlocal cancelling
        cancelling = True  # RolloutManager.abort() while the first turn runs
        return model_answer("<calc>1", kind="abort")

    samples, requests = _through_server(script, n=2, concurrency=1, cancelled=lambda: cancelling)
    assert len(requests) == 1, "the second sample must not send a request after the abort"
    assert [s.status for s in samples] == [Status.ABORTED, Status.ABORTED]
    assert samples[0].response_ids == [] and samples[1].response_ids == []


def test_retries_used_up_fail_the_rollout_and_concurrency_is_per_sample() -> None:
    with pytest.raises(GenerationError, match="sample 0: 4 tries failed, the last with HTTP 502"):
        _through_server(lambda call, body: web.json_response({}, status=502))

    in_flight = peak = 0

    async def body(url: str) -> list[Sample]:
        nonlocal in_flight, peak

        async def counting(ctx: cg.GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            for _ in range(2):  # two turns hold one slot
                cg.append_model_turn(sample, await ctx.generate(sample.tokens, params))
                await asyncio.sleep(0.01)
            in_flight -= 1
            return sample

        samples = [Sample(index=i, prompt_ids=list(PROMPT)) for i in range(6)]
        return await cg.generate_samples_with_hook(
            cg.Hook(counting, "t:counting"), url, samples, PARAMS, tokenizer=TOK, concurrency=2, retry=FAST
        )

    out, requests = asyncio.run(_serve(lambda call, b: model_answer("x", matched=2), body))
    assert peak == 2 and len(requests) == 12 and all(s.response == "xx" for s in out)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        asyncio.run(
            cg.generate_samples_with_hook(CALCULATOR, "http://x", [Sample(index=0)], PARAMS, tokenizer=TOK)
        )


# ---- the calculator's parser -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12*7", "84"),
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("10 - 4 - 3", "3"),
        ("2 * -3", "-6"),
        ("-(2 + 3)", "-5"),
        ("--4", "4"),
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333"),
        ("8 / 4", "2"),
        ("0.1 + 0.2", "0.3"),
        (".5 * 4", "2"),
        (" 37 *23 ", "851"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculator_tool.calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os').system('ls')", "unexpected character '_'"),
        ("().__class__", "unexpected character '.'"),
        ("2**10", "unexpected '\\*'"),
        ("abs(-1)", "unexpected character 'a'"),
        ("1/0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("", "empty expression"),
        ("(1+2", "unexpected end"),
        ("1+2)", "unexpected '\\)'"),
        ("1 2", "unexpected '2'"),
        ("9" * 31, "number too large"),
        ("99999999999*" * 4 + "9", "number too large"),
        ("(" * 60 + "1" + ")" * 60, "longer than 100 characters"),
        ("-" * 51 + "1", "too deeply nested"),
        ("(" * 51 + "1" + ")" * 48, "too deeply nested"),
    ],
)
def test_calculator_refuses_anything_else(expression: str, error: str) -> None:
    with pytest.raises(calculator_tool.CalcError, match=error):
        calculator_tool.calculate(expression)


def test_tool_output_and_call_parsing() -> None:
    assert calculator_tool.tool_output("6*7") == "<result>42</result>"
    assert calculator_tool.tool_output("6/0") == "<result>error: division by zero</result>"
    assert calculator_tool.last_call("a <calc>1+1</calc> b <calc>2*3</calc>") == "2*3"
    assert calculator_tool.last_call("no call <calc>1+") is None


# ---- prepare fails fast on a hook it cannot use -----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rljob_runtime.models.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def _spec(model: Path, hook: str) -> Any:
    from rljob_api.resource import parse_spec

    return parse_spec(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": str(REPO / "examples/data/add-1digit.jsonl"), "applyChatTemplate": False},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2, "customGenerate": hook},
            "training": {"backend": "torch", "globalBatchSize": 4, "microBatchSize": 1},
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )


def test_prepare_refuses_a_hook_it_cannot_import_or_call(tiny_model: Path) -> None:
    import ray

    from rljob_runtime.prepare import prepare

    with pytest.raises(
        cg.CustomGenerateError,
        match=r"rollout.customGenerate 'my_missing_hooks:generate': cannot import module 'my_missing_hooks'",
    ):
        prepare(_spec(tiny_model, "my_missing_hooks:generate"))
    with pytest.raises(
        cg.CustomGenerateError,
        match=r"rollout.customGenerate 'calculator_tool:calculate': must be an async function",
    ):
        prepare(_spec(tiny_model, "calculator_tool:calculate"))
    assert not ray.is_initialized()
    assert prepare(_spec(tiny_model, "calculator_tool:generate")).spec.rollout.custom_generate
