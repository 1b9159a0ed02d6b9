"""Custom generate hooks (``rollout.customGenerate``): multi-turn and tool-calling rollouts.

A hook replaces the single ``/generate`` call per sample (slime's ``--custom-generate-function-path``)::

    async def generate(ctx: GenerateContext, sample: Sample, sampling_params: dict) -> Sample

- ``sample`` arrives with its prompt (``prompt``, ``prompt_ids``, ``label``, ``metadata``) and an
  empty response; ``sampling_params`` is this rollout's parameters (a copy the hook may change).
- ``await ctx.generate(input_ids, sampling_params)`` is one ``/generate`` call through the router with
  the retries of plain rollouts (errors, aborts by weight updates resent); it returns SGLang's answer.
  After ``RolloutManager.abort()`` it raises ``GenerationAborted`` and the sample ends ABORTED.
- ``append_model_turn(sample, answer)`` appends a model turn (its token ids and logprobs, loss mask 1)
  and sets the status from the finish reason; ``append_tool_turn(sample, ids, text)`` appends tool /
  environment output (loss mask 0, logprob 0.0). Both keep ``response_ids``, ``loss_mask``,
  ``rollout_logprobs``, ``response_length`` and ``response`` aligned.
- The hook returns the sample (the same object, or a Sample whose fields replace its fields) with a
  final status; ``check_sample`` then refuses an inconsistent one with an error naming the hook.

The next model turn's input is ``sample.tokens`` (prompt and response so far): the token ids the model
produced are never re-tokenized, so the trainer sees exactly what was sampled.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .. import engine_api
from ..data.rewards.custom import import_function
from ..data.sample import Sample, Status
from .generate import (
    GenerationError,
    Hold,
    RetryPolicy,
    finish_type,
    post_generate,
    request_body,
    run_bounded,
    status_from_finish_reason,
)

FIELD = "rollout.customGenerate"
DEFAULT_RETRY = RetryPolicy()  # slime's: 60 tries 1 s apart
HookFn = Callable[["GenerateContext", Sample, dict[str, Any]], Awaitable[Sample]]


class CustomGenerateError(GenerationError):
    """The hook cannot be loaded, raised, or left its sample inconsistent; the message names it."""


class GenerationAborted(Exception):
    """The rollout is being cancelled (``RolloutManager.abort``): the sample ends with status aborted."""


@dataclass(frozen=True)
class Hook:
    """A loaded, checked hook and the path it came from (for messages)."""

    fn: HookFn
    path: str


def check_hook(fn: Callable[..., Any], path: str) -> Hook:
    """Refuse anything but ``async def fn(ctx, sample, sampling_params)``; errors name the field."""
    where = f"{FIELD} {path!r}"
    if not inspect.iscoroutinefunction(fn):
        raise CustomGenerateError(
            f"{where}: must be an async function (async def fn(ctx, sample, sampling_params)), "
            f"got {type(fn).__name__} {getattr(fn, '__name__', fn)!r}"
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise CustomGenerateError(f"{where}: cannot read its signature: {exc}") from exc
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    required_kw = [p for p in params if p.kind == p.KEYWORD_ONLY and p.default is inspect.Parameter.empty]
    takes_varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    if len(required) > 3 or required_kw or (len(positional) < 3 and not takes_varargs):
        raise CustomGenerateError(
            f"{where}: takes ({', '.join(p.name for p in params)}); expected (ctx, sample, sampling_params)"
        )
    return Hook(fn, path)


def load_hook(path: str) -> Hook:
    """Import ``path`` ('package.module:function') and check it; every error names the field and path."""
    return check_hook(import_function(path, field=FIELD, error=CustomGenerateError), path)


# ---- the hook's toolbox ------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """What one ``append_model_turn`` added."""

    ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str | None
    matched: Any  # the stop string or token id that ended the turn, if any


def _ensure_mask(sample: Sample) -> list[int]:
    # A sample filled by plain generate has no mask (all ones): make it explicit before appending.
    if sample.loss_mask is None:
        sample.loss_mask = [1] * len(sample.response_ids)
    return sample.loss_mask


def append_model_turn(sample: Sample, response: dict[str, Any]) -> Turn:
    """Append a ``/generate`` answer as a model turn: its ids and logprobs, loss mask 1; status from it.

    Ids come from ``output_token_logprobs`` (aligned with the logprobs by construction). Turns without
    logprobs (``output_ids`` only) are refused when the sample has logprobs, and vice versa, since the
    trainer needs one logprob per response token or none at all.
    """
    meta = response.get("meta_info") or {}
    entries = meta.get("output_token_logprobs")
    if entries is not None:
        ids = [int(entry[1]) for entry in entries]
        logprobs: list[float] | None = [float(entry[0]) for entry in entries]
    else:
        ids = [int(t) for t in response.get("output_ids") or []]
        logprobs = None
    if sample.response_ids and (logprobs is None) != (sample.rollout_logprobs is None):
        raise ValueError(
            f"sample {sample.index}: a turn {'without' if logprobs is None else 'with'} logprobs after "
            "turns that differ (request return_logprob for every turn)"
        )
    mask = _ensure_mask(sample)
    if logprobs is not None:
        sample.rollout_logprobs = [*(sample.rollout_logprobs or []), *logprobs]
    sample.response_ids.extend(ids)
    mask.extend([1] * len(ids))
    text = str(response.get("text") or "")
    sample.response += text
    sample.response_length = len(sample.response_ids)
    kind = finish_type(response)
    sample.status = status_from_finish_reason(kind)
    sample.metadata["finish_reason"] = kind
    version = meta.get("weight_version")
    if version is not None and str(version) not in sample.weight_versions:
        sample.weight_versions.append(str(version))
    reason = meta.get("finish_reason")
    matched = reason.get("matched") if isinstance(reason, dict) else None
    return Turn(ids, logprobs, text, kind, matched)


def append_tool_turn(sample: Sample, ids: Sequence[int], text: str = "") -> None:
    """Append tool / environment output: loss mask 0 (not trained on), logprob 0.0 (not sampled)."""
    mask = _ensure_mask(sample)
    ids = [int(t) for t in ids]
    # logprobs stay None only when earlier model turns came without them
    if sample.rollout_logprobs is not None or not sample.response_ids:
        sample.rollout_logprobs = [*(sample.rollout_logprobs or []), *([0.0] * len(ids))]
    sample.response_ids.extend(ids)
    mask.extend([0] * len(ids))
    sample.response += text
    sample.response_length = len(sample.response_ids)


def check_sample(sample: Sample, path: str) -> None:
    """Refuse a sample the trainer would misread: misaligned lists, masks not 0/1, no final status."""
    where = f"{FIELD} {path!r} left sample {sample.index} inconsistent"
    n = len(sample.response_ids)
    problems = []
    if sample.response_length != n:
        problems.append(f"response_length {sample.response_length} != len(response_ids) {n}")
    if sample.loss_mask is not None:
        if len(sample.loss_mask) != n:
            problems.append(f"len(loss_mask) {len(sample.loss_mask)} != len(response_ids) {n}")
        if any(m not in (0, 1) for m in sample.loss_mask):
            problems.append("loss_mask holds values other than 0 and 1")
    if sample.rollout_logprobs is not None and len(sample.rollout_logprobs) != n:
        problems.append(f"len(rollout_logprobs) {len(sample.rollout_logprobs)} != len(response_ids) {n}")
    if sample.status is Status.PENDING:
        problems.append("status is still pending (set completed, truncated, aborted or failed)")
    if problems:
        raise CustomGenerateError(f"{where}: {'; '.join(problems)}")


# ---- running hooks ---------------------------------------------------------------------------------


@dataclass
class GenerateContext:
    """What a hook gets besides its sample: generation through the router, the tokenizer, the spec."""

    session: aiohttp.ClientSession
    url: str
    tokenizer: Any
    spec: Any = None  # the job's RLTrainingJobSpec (None in unit tests)
    max_response_len: int = 0  # the response budget in tokens: this rollout's max_new_tokens
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cancelled: Callable[[], bool] = lambda: False
    hold: Hold | None = None
    what: str = "sample"
    requests: int = 0  # /generate tries made for this sample (retries included)
    aborted: bool = False

    async def generate(self, input_ids: Sequence[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        """One ``/generate`` call (logprobs on) with plain rollouts' retries; the answer as a dict.

        Raises ``GenerationAborted`` when the rollout is cancelled (also before sending: no new
        request starts after an abort) and ``GenerationError`` when the retries are used up.
        """
        if self.cancelled():
            self.aborted = True
            raise GenerationAborted(self.what)
        if not input_ids:
            raise ValueError(f"{self.what}: input_ids is empty")
        body = engine_api.generate_body(input_ids=input_ids, params=sampling_params, return_logprob=True)
        response, tries = await post_generate(
            self.session,
            self.url,
            body,
            what=self.what,
            retry=self.retry,
            cancelled=self.cancelled,
            hold=self.hold,
        )
        self.requests += tries
        if finish_type(response) == "abort":  # only while cancelling: final
            self.aborted = True
            raise GenerationAborted(self.what)
        return response

    def budget_left(self, sample: Sample) -> int:
        """Response tokens still allowed (``max_response_len`` minus what the sample holds)."""
        return self.max_response_len - len(sample.response_ids)


async def run_hook(hook: Hook, ctx: GenerateContext, sample: Sample, params: dict[str, Any]) -> Sample:
    """Run ``hook`` on ``sample`` (filled in place), then check what it left."""
    where = f"{FIELD} {hook.path!r}"
    try:
        result: Any = await hook.fn(ctx, sample, dict(params))
    except GenerationAborted:
        result = sample
    except GenerationError:
        raise  # retries used up: already says which sample and why
    except Exception as exc:
        raise CustomGenerateError(f"{where} raised {exc!r} on sample {sample.index}") from exc
    if not isinstance(result, Sample):
        raise CustomGenerateError(
            f"{where} returned {type(result).__name__} for sample {sample.index}; expected the Sample"
        )
    if result is not sample:  # callers hold the original objects: fill them
        for f in dataclasses.fields(Sample):
            setattr(sample, f.name, getattr(result, f.name))
    if ctx.aborted:  # even if the hook caught GenerationAborted itself
        sample.status = Status.ABORTED
        sample.metadata["finish_reason"] = "abort"
    sample.metadata["rollout_tries"] = ctx.requests
    check_sample(sample, hook.path)
    return sample


async def generate_samples_with_hook(
    hook: Hook,
    url: str,
    samples: Sequence[Sample],
    params: dict[str, Any],
    *,
    tokenizer: Any,
    spec: Any = None,
    concurrency: int = 64,
    retry: RetryPolicy = DEFAULT_RETRY,
    cancelled: Callable[[], bool] = lambda: False,
    session: aiohttp.ClientSession | None = None,
    hold: Hold | None = None,
) -> list[Sample]:
    """``generate_samples`` with ``hook`` per sample: same concurrency limit (one slot per sample for
    all its turns), same retries, same cancellation; the first failure is raised, the rest cancelled."""
    for sample in samples:
        request_body(sample, params)  # a sample without prompt ids fails before any request

    async def one(sample: Sample, http: aiohttp.ClientSession) -> Sample:
        ctx = GenerateContext(
            session=http,
            url=url,
            tokenizer=tokenizer,
            spec=spec,
            max_response_len=int(params.get("max_new_tokens") or 0),
            retry=retry,
            cancelled=cancelled,
            hold=hold,
            what=f"sample {sample.index}",
        )
        return await run_hook(hook, ctx, sample, params)

    return await run_bounded(samples, one, concurrency=concurrency, session=session)
