"""Generate responses for a batch of Samples through the router, losing none of them.

Each sample becomes one ``/generate`` request (token ids in, logprobs out). A resumable sample (a
partial response kept from an abort, ``Sample.resumable``) is continued: the request's input is the
prompt plus the partial response, its ``max_new_tokens`` what is left of the budget, and the answer
is appended as one more segment (``Sample.token_versions`` records which weight version made each
token). A partial response that already used the whole budget ends truncated without a request.

What is retried:

- errors: a connection error, a timeout, HTTP 5xx / 408 / 429 (an engine died mid-request, the
  router had no live worker for a moment): up to ``RetryPolicy.max_attempts`` tries in all, waiting
  ``RetryPolicy.delay(n)`` between them; then ``GenerationError``.
- aborts: a response with ``finish_reason.type == "abort"`` while the caller is not cancelling (a
  weight update paused the engines with mode ``abort``), up to ``RetryPolicy.max_abort_retries``
  times, without waiting (a paused engine holds the new request until it continues). By default the
  request is resent as it was: the partial output is dropped, so every token of a segment comes from
  one weight version. With ``continue_aborted`` the partial output is kept and the next request
  continues it (partial rollout: a response may then span weight versions). When the caller cancels
  (``cancel`` set), an abort is final: status aborted, with the tokens generated so far kept on the
  sample (a later rollout may continue it).

Other HTTP 4xx answers are bugs in the request and fail at once.

``hold`` (the engine fleet's): after a failed try, it waits while no engine serves and a dead one
is being replaced (an SGLang relaunch takes longer than the retries last) and answers True; such a
try is not counted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from .. import engine_api
from ..data.sample import Sample, Status, version_number

if TYPE_CHECKING:
    from rljob_api.spec_rollout import RolloutSpec

log = logging.getLogger("rljob.rollout.generate")

RETRYABLE_STATUS = frozenset({408, 429})
Hold = Callable[[], Awaitable[bool]]


class GenerationError(RuntimeError):
    """A sample could not be generated within the retry policy."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of one request; the default is slime's 60 tries 1 s apart."""

    max_attempts: int = 60
    backoff_s: float = 1.0
    backoff_multiplier: float = 1.0
    max_backoff_s: float = 30.0
    max_abort_retries: int = 100
    request_timeout_s: float | None = None  # None: no client timeout (health checks catch hung engines)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.backoff_s < 0 or self.backoff_multiplier < 1 or self.max_abort_retries < 0:
            raise ValueError("backoff_s >= 0, backoff_multiplier >= 1, max_abort_retries >= 0")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed try (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * self.backoff_multiplier ** (failures - 1))


def sampling_params_from_spec(rollout: RolloutSpec, **overrides: Any) -> dict[str, Any]:
    """``sampling_params`` for a ``RolloutSpec`` (max_new_tokens = maxResponseLen); overrides win."""
    params: dict[str, Any] = dict(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_response_len,
        stop=list(rollout.stop) or None,
        stop_token_ids=list(rollout.stop_token_ids) or None,
    )
    params.update(overrides)
    return engine_api.sampling_params(**params)


def tokens_left(sample: Sample, params: dict[str, Any]) -> int | None:
    """Response tokens ``sample`` may still generate under ``params``' ``max_new_tokens`` (the whole
    response's budget, partial output included); None when the params set no budget."""
    budget = params.get("max_new_tokens")
    if budget is None:
        return None
    return int(budget) - (len(sample.response_ids) if sample.resumable else 0)


def request_body(sample: Sample, params: dict[str, Any], *, routed_experts: bool = False) -> dict[str, Any]:
    """The ``/generate`` body for one sample: its prompt token ids, logprobs requested, and the
    routed experts with ``routed_experts`` (training.routingReplay).

    A resumable sample continues from prompt + partial response with ``max_new_tokens`` reduced by
    the tokens it holds (never below 0; ``generate_one`` sends nothing then). ``params`` is not changed.
    """
    if not sample.prompt_ids:
        raise ValueError(f"sample {sample.index}: prompt_ids is empty (tokenize prompts before rollout)")
    if not sample.resumable:
        return engine_api.generate_body(
            input_ids=sample.prompt_ids,
            params=params,
            return_logprob=True,
            return_routed_experts=routed_experts,
        )
    left = tokens_left(sample, params)
    if left is not None:
        params = {**params, "max_new_tokens": max(0, left)}
    return engine_api.generate_body(
        input_ids=sample.tokens, params=params, return_logprob=True, return_routed_experts=routed_experts
    )


def finish_type(response: dict[str, Any]) -> str | None:
    reason = (response.get("meta_info") or {}).get("finish_reason")
    if isinstance(reason, dict):
        return reason.get("type")
    return reason  # older SGLang answers a bare string


def status_from_finish_reason(kind: str | None) -> Status:
    """stop -> completed, length -> truncated, abort -> aborted; anything else is a failure."""
    return {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}.get(
        kind or "", Status.FAILED
    )


def apply_response(sample: Sample, response: dict[str, Any]) -> Sample:
    """Fill ``sample``'s response fields from a ``/generate`` answer (in place; returns it).

    Token ids come from ``output_token_logprobs`` (``[logprob, token_id, text]`` per token), so ids
    and logprobs are aligned by construction; ``output_ids`` is the fallback without logprobs.

    The answer to a resumable sample's request (``request_body`` continued it) is appended as a new
    segment: ids, logprobs (None if either side has none: they could not be aligned), text, token
    versions (empty if either side's are unknown), a new ``weight_versions`` label; the status is the
    new segment's. ``metadata["rollout_segments"]`` counts the answers the response is made of.
    Otherwise the answer replaces the response.

    ``meta_info.routed_experts`` (training.routingReplay) covers the whole sequence the answer ends,
    a continued one's earlier tokens included: it replaces the sample's record (None when absent).
    """
    meta = response.get("meta_info") or {}
    entries = meta.get("output_token_logprobs")
    ids: list[int]
    logprobs: list[float] | None
    if entries is not None:
        ids = [int(entry[1]) for entry in entries]
        logprobs = [float(entry[0]) for entry in entries]
    else:
        ids = [int(t) for t in response.get("output_ids") or []]
        logprobs = None
    text = str(response.get("text") or "")
    raw_label = meta.get("weight_version")
    label = str(raw_label) if raw_label is not None else None
    # An answer carries the version serving when it finished; weight updates pause with mode abort
    # (engine_update), which cuts a segment, so that version made all of its tokens.
    number = version_number(label)
    versions = [number] * len(ids) if number is not None else []
    if sample.resumable:
        aligned = len(sample.token_versions) == len(sample.response_ids)
        sample.token_versions = [*sample.token_versions, *versions] if aligned and number is not None else []
        if logprobs is None or sample.rollout_logprobs is None:
            sample.rollout_logprobs = None
        else:
            sample.rollout_logprobs = [*sample.rollout_logprobs, *logprobs]
        if sample.loss_mask is not None:  # keep an explicit mask aligned
            sample.loss_mask = [*sample.loss_mask, *([1] * len(ids))]
        sample.response_ids = [*sample.response_ids, *ids]
        sample.response += text
        if label is not None and ids and label not in sample.weight_versions:
            sample.weight_versions = [*sample.weight_versions, label]
        sample.metadata["rollout_segments"] = int(sample.metadata.get("rollout_segments") or 1) + 1
    else:
        sample.response_ids = ids
        sample.rollout_logprobs = logprobs
        sample.response = text
        sample.token_versions = versions
        sample.weight_versions = [label] if label is not None else []
        sample.metadata["rollout_segments"] = 1
    sample.response_length = len(sample.response_ids)
    record = meta.get("routed_experts")
    sample.rollout_routed_experts = record if isinstance(record, str) else None
    kind = finish_type(response)
    sample.status = status_from_finish_reason(kind)
    sample.metadata["finish_reason"] = kind
    return sample


class _Retryable(Exception):
    pass


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float | None) -> Any:
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text()
            if resp.status >= 500 or resp.status in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {resp.status}: {text[:300]}")
            if resp.status != 200:
                raise GenerationError(f"POST {url}: HTTP {resp.status}: {text[:500]}")
            try:
                return await resp.json(content_type=None)
            except ValueError as exc:
                raise _Retryable(f"answer is not JSON: {text[:300]}") from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _Retryable(f"{type(exc).__name__}: {exc}") from exc


# Where a request goes: one URL (the router), or a choice made again at every try (an engine, directly)
Target = str | Callable[[], str]


async def post_generate(
    session: aiohttp.ClientSession,
    url: Target,
    body: dict[str, Any],
    *,
    what: str,
    retry: RetryPolicy = RetryPolicy(),
    cancelled: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], Any] = asyncio.sleep,
    hold: Hold | None = None,
    resend_aborts: bool = True,
) -> tuple[dict[str, Any], int]:
    """POST ``body`` to ``url``/generate with the retry policy of the module docstring (``url`` called
    again at each try when it is a choice: a replaced engine has a new address).

    Returns the answer and the number of tries; an abort comes back only while ``cancelled()``, or
    at once without ``resend_aborts`` (the caller continues it and bounds the aborts itself).
    ``what`` names the request in errors and logs (e.g. "sample 3").
    """
    failures = aborts = 0
    while True:
        try:
            base = url if isinstance(url, str) else url()
            response = await _post(session, f"{base}/generate", body, retry.request_timeout_s)
        except _Retryable as exc:
            if hold is not None and await hold():
                continue  # no engine was serving: a replacement is back now, the try does not count
            failures += 1
            if failures >= retry.max_attempts:
                raise GenerationError(f"{what}: {failures} tries failed, the last with {exc}") from None
            delay = retry.delay(failures)
            log.info("%s: try %d failed (%s); retrying in %.1f s", what, failures, exc, delay)
            await sleep(delay)
            continue
        if resend_aborts and finish_type(response) == "abort" and not cancelled():
            aborts += 1
            if aborts > retry.max_abort_retries:
                raise GenerationError(f"{what}: aborted {aborts} times (weight updates?)")
            continue
        return response, failures + aborts + 1


async def generate_one(
    session: aiohttp.ClientSession,
    url: Target,
    sample: Sample,
    params: dict[str, Any],
    *,
    retry: RetryPolicy = RetryPolicy(),
    cancelled: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], Any] = asyncio.sleep,
    hold: Hold | None = None,
    continue_aborted: bool = False,
    routed_experts: bool = False,
) -> Sample:
    """One sample through ``url``/generate with the retry policy of the module docstring.

    A resumable sample is continued; ``continue_aborted`` keeps the partial output of an abort that
    is not a cancellation and continues it (else the request is resent as it was). ``routed_experts``:
    ask for the routing record (``request_body``).
    """
    what = f"sample {sample.index}"
    tries = aborts = 0
    while True:
        left = tokens_left(sample, params)
        if sample.resumable and left is not None and left <= 0:
            # the partial response already holds the whole budget: it ends as the engine would end it
            sample.status = Status.TRUNCATED
            sample.metadata["finish_reason"] = "length"
            break
        response, n = await post_generate(
            session,
            url,
            request_body(sample, params, routed_experts=routed_experts),
            what=what,
            retry=retry,
            cancelled=cancelled,
            sleep=sleep,
            hold=hold,
            resend_aborts=not continue_aborted,
        )
        tries += n
        apply_response(sample, response)
        if not continue_aborted or sample.status is not Status.ABORTED or cancelled():
            break
        aborts += 1
        if aborts > retry.max_abort_retries:
            raise GenerationError(f"{what}: aborted {aborts} times (weight updates?)")
    sample.metadata["rollout_tries"] = tries
    return sample


async def run_bounded(
    samples: Sequence[Sample],
    one: Callable[[Sample, aiohttp.ClientSession], Awaitable[Sample]],
    *,
    concurrency: int,
    session: aiohttp.ClientSession | None,
) -> list[Sample]:
    """``one(sample, session)`` for every sample, at most ``concurrency`` at once, results in order.

    The first failure cancels the others and is raised as itself (not as an exception group).
    """
    semaphore = asyncio.Semaphore(concurrency)

    async def bounded(sample: Sample, http: aiohttp.ClientSession) -> Sample:
        async with semaphore:
            return await one(sample, http)

    async def run(http: aiohttp.ClientSession) -> list[Sample]:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(bounded(sample, http)) for sample in samples]
        return [task.result() for task in tasks]

    try:
        if session is not None:
            return await run(session)
        # the router multiplexes; keep our connections bounded by the same limit
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as http:
            return await run(http)
    except BaseExceptionGroup as group:  # TaskGroup wraps; callers want the first failure itself
        raise group.exceptions[0] from None


async def generate_samples(
    url: str | Callable[[Sample], str],
    samples: Sequence[Sample],
    params: dict[str, Any],
    *,
    concurrency: int = 64,
    retry: RetryPolicy = RetryPolicy(),
    cancelled: Callable[[], bool] = lambda: False,
    session: aiohttp.ClientSession | None = None,
    hold: Hold | None = None,
    continue_aborted: bool = False,
    routed_experts: bool = False,
) -> list[Sample]:
    """Generate every sample (in place) through the router at ``url``, at most ``concurrency`` at once;
    or, ``url`` a choice of engine per sample, straight to the engine it names at each try.

        Resumable samples are continued; ``continue_aborted`` and ``routed_experts`` as in ``generate_one``. Raises
        ``GenerationError`` if one sample exhausts its retries; the others are cancelled then.
    """
    for sample in samples:
        request_body(sample, params)  # a bad sample fails before any request is sent

    async def one(sample: Sample, http: aiohttp.ClientSession) -> Sample:
        return await generate_one(
            http,
            url if isinstance(url, str) else functools.partial(url, sample),
            sample,
            params,
            retry=retry,
            cancelled=cancelled,
            hold=hold,
            continue_aborted=continue_aborted,
            routed_experts=routed_experts,
        )

    return await run_bounded(samples, one, concurrency=concurrency, session=session)
