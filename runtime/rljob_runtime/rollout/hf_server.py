# long-file: one HTTP server: each SGLang endpoint the hf engine serves, and its batching
"""The ``hf`` rollout engine: an HTTP server speaking the subset of SGLang's API the runtime uses.

    python -m rljob_runtime.rollout.hf_server --model-path P --host 127.0.0.1 --port N \
        [--dtype float32] [--seed S] [--device cpu] [--max-batch-size 64] [--threads T]

Backed by transformers (``hf_engine``); built on aiohttp. Requests that arrive while a batch runs
wait and form the next batch together (dynamic batching: one prefill + one decode loop for all of
them, which is what makes CPU generation bearable).

Endpoints and how they differ from SGLang (see docs/runtime-env.md and SGLang's own
``sglang/srt/entrypoints/http_server.py``):

- ``POST /generate``: ``input_ids`` or ``text`` (a single prompt or a list); ``sampling_params``
  (see ``hf_engine.SamplingParams``); ``return_logprob``; ``rid``. Unknown fields (the router adds
  ``model``, ``stream``, ``log_metrics``...) are ignored; ``stream: true`` is answered non-streamed.
  Response ``{text, output_ids, meta_info: {id, finish_reason, prompt_tokens, completion_tokens,
  cached_tokens: 0, weight_version, output_token_logprobs: [[logprob, token_id, null], ...]}}``.
- ``POST /abort_request`` ``{rid}`` or ``{abort_all: true}``: the request(s) finish with
  ``finish_reason.type == "abort"`` and the tokens generated so far.
- ``POST /pause_generation`` ``{mode: abort|retract|in_place}`` (default ``abort``: in-flight requests
  are aborted). While paused, new requests wait; ``retract`` / ``in_place`` keep the partial output
  of running requests and resume them on ``POST /continue_generation``.
- ``GET|POST /flush_cache``: 400 while requests are running or waiting to run (as SGLang); there is
  no prefix cache, so success does nothing else.
- ``POST /update_weights_from_disk`` ``{model_path, weight_version}``: loads the safetensors of an HF
  directory of the same architecture. ``POST /update_weights_from_tensor``: our CPU format (see
  ``engine_api.serialize_named_tensors``) or a CUDA IPC bucket (``sync/cuda_ipc.py``). Both wait for the running batch and bump
  ``weight_version`` when given.
- ``/release_memory_occupation``, ``/resume_memory_occupation``: no-ops (200).
- ``POST /init_weights_update_group`` ``{master_address, master_port, rank_offset, world_size,
  group_name, backend}`` (+ ``timeout_s``, ours): join the trainer's weight-update group (NCCL on a
  CUDA engine; gloo on CPU, for tests). ``POST /update_weights_from_distributed`` ``{names, dtypes,
  shapes, group_name, load_format, weight_version}``: receive one broadcast (a flattened bucket, or
  one per tensor without ``load_format``) and load it; on a GPU it answers once the receive and copies
  are queued (stream-ordered before any later generation, as SGLang), and the request carrying
  ``weight_version`` waits for them all. ``POST /destroy_weights_update_group``.
  See ``sync/nccl.py``.
- ``GET /health_generate``: 200 once a one-token probe finishes or the running batch steps (as
  SGLang, which counts any scheduler output after the check began); 503 after ``health_timeout_s``
  (20 s, SGLang's default) without either. 200 at once while paused.
- ``GET /weights_checksum[?names=a,b]`` (ours): exact per-tensor checksums of the served weights.
"""

from __future__ import annotations

import os

# OpenMP threads that spin at barriers collapse when the cores are shared (CI, laptops running
# builds): on 2 busy cores a SmolLM2 decode step took 1.6 s with torch's default active wait and
# 0.06 s with PASSIVE. libgomp reads this when torch loads, so it is set before importing torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import collections
import functools
import itertools
import logging
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from aiohttp import web

from .. import engine_api
from .hf_engine import HFEngine, Request, SamplingParams
from .hf_weights import WeightEndpoints
from .http_util import bad_request, json_or_empty

log = logging.getLogger("rljob.hf_server")

_PAUSE_MODES = ("abort", "retract", "in_place")


class HFServer(WeightEndpoints):
    """Request queue, batch scheduler and HTTP handlers around one ``HFEngine`` (the weight endpoints
    are ``hf_weights.WeightEndpoints``)."""

    def __init__(
        self,
        engine: HFEngine,
        *,
        seed: int = 0,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.005,
        health_timeout_s: float = 20.0,
        args: dict[str, Any],
    ) -> None:
        """``health_timeout_s``: how long ``/health_generate`` waits for the engine to make progress
        (SGLang's ``SGLANG_HEALTH_CHECK_TIMEOUT``, 20 s by default)."""
        self.engine = engine
        self.health_timeout_s = health_timeout_s
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.args = args
        self.weight_version = engine_api.DEFAULT_WEIGHT_VERSION
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.futures: dict[str, asyncio.Future[Request]] = {}
        self.paused: str | None = None  # pause mode while paused
        self.counter = itertools.count()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self.wake = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.scheduler: asyncio.Task[None] | None = None
        self.started = time.time()
        self.total_requests = 0
        self.update_groups: dict[str, Any] = {}  # group name -> sync.nccl.WeightUpdateGroup

    # ---- scheduling -----------------------------------------------------------------------------

    def _make_request(
        self, prompt_ids: list[int], params: SamplingParams, return_logprob: bool, rid: str
    ) -> Request:
        seed = (
            params.sampling_seed
            if params.sampling_seed is not None
            else self.seed * 1_000_003 + next(self.counter)
        )
        generator = torch.Generator(device=self.engine.device)
        generator.manual_seed(int(seed))
        return Request(
            rid=rid, prompt_ids=prompt_ids, params=params, return_logprob=return_logprob, generator=generator
        )

    def _resolve(self, req: Request) -> None:
        future = self.futures.pop(req.rid, None)
        if future is not None and not future.done():
            future.set_result(req)

    def _on_finish_threadsafe(self, req: Request) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._resolve, req)

    def _should_yield(self) -> bool:
        return self.paused in ("retract", "in_place")

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.waiting and self.paused is None:
                await asyncio.sleep(self.batch_wait_s)  # let concurrent arrivals join this batch
                batch = [self.waiting.popleft() for _ in range(min(self.max_batch_size, len(self.waiting)))]
                self.running = batch
                try:
                    await loop.run_in_executor(
                        self.executor,
                        functools.partial(
                            self.engine.run_batch,
                            batch,
                            should_yield=self._should_yield,
                            on_finish=self._on_finish_threadsafe,
                            weight_version=lambda: self.weight_version,
                        ),
                    )
                except Exception as exc:  # a bad batch fails its requests, not the server
                    log.exception("batch failed")
                    for req in batch:
                        future = self.futures.pop(req.rid, None)
                        if future is not None and not future.done():
                            future.set_exception(exc)
                finally:
                    self.running = []
                    # yielded (pause retract / in_place): back to the front of the queue, partial output kept
                    unfinished = [req for req in batch if not req.finished and req.rid in self.futures]
                    for req in unfinished:
                        if req.abort_requested:
                            self._finish_now(req, {"type": "abort", "message": "Aborted while paused"})
                    self.waiting.extendleft(reversed([req for req in unfinished if not req.finished]))

    def _finish_now(self, req: Request, reason: dict[str, Any]) -> None:
        req.finish_reason = reason
        req.weight_version = self.weight_version
        self.engine.finalize_text(req)
        self._resolve(req)

    def _abort(self, rid: str | None) -> int:
        count = 0
        for req in list(self.waiting):
            if rid is None or req.rid == rid:
                self.waiting.remove(req)
                self._finish_now(req, {"type": "abort", "message": "Abort in waiting queue"})
                count += 1
        for req in self.running:
            if rid is None or req.rid == rid:
                req.abort_requested = True
                count += 1
        return count

    # ---- handlers -------------------------------------------------------------------------------

    def _response(self, req: Request, prompt_len: int) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finish_reason,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": 0,
            "weight_version": req.weight_version,
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tok, None] for lp, tok in zip(req.output_logprobs, req.output_ids, strict=True)
            ]
        return {"text": req.text, "output_ids": list(req.output_ids), "meta_info": meta}

    async def generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return bad_request("body is not JSON")
        if not isinstance(body, dict):
            return bad_request("body must be a JSON object")
        text: Any = body.get("text")  # JSON: checked below
        input_ids: Any = body.get("input_ids")
        if (text is None) == (input_ids is None):
            return bad_request("give exactly one of text and input_ids")
        batched = isinstance(text, list) or (
            isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)
        )
        prompts: list[list[int]]
        if text is not None:
            texts = text if isinstance(text, list) else [text]
            prompts = [self.engine.encode(t) for t in texts]
        else:
            prompts = input_ids if batched else [input_ids]
        if not all(prompts) or not all(isinstance(t, int) for p in prompts for t in p):
            return bad_request("input_ids must be non-empty lists of integers")
        vocab = self.engine.model.get_input_embeddings().weight.shape[0]
        if any(t < 0 or t >= vocab for p in prompts for t in p):
            return bad_request(f"input_ids out of range [0, {vocab})")
        sp_raw = body.get("sampling_params") or {}
        sp_list = sp_raw if isinstance(sp_raw, list) else [sp_raw] * len(prompts)
        rid_raw = body.get("rid")
        rids = rid_raw if isinstance(rid_raw, list) else [rid_raw] * len(prompts)
        if len(sp_list) != len(prompts) or len(rids) != len(prompts):
            return bad_request("sampling_params / rid lists must match the number of prompts")
        try:
            params = [SamplingParams.from_json(sp) for sp in sp_list]
        except (TypeError, ValueError) as exc:
            return bad_request(f"bad sampling_params: {exc}")
        return_logprob = bool(body.get("return_logprob", False))
        assert self.loop is not None
        reqs = []
        for index, (prompt, sp, rid) in enumerate(zip(prompts, params, rids, strict=True)):
            if rid is None:
                rid = uuid.uuid4().hex
            elif batched and not isinstance(rid_raw, list):
                rid = f"{rid}_{index}"
            rid = str(rid)
            if rid in self.futures:
                return bad_request(f"duplicate rid {rid!r}")
            req = self._make_request(list(prompt), sp, return_logprob, rid)
            self.futures[rid] = self.loop.create_future()
            reqs.append(req)
        futures = [self.futures[req.rid] for req in reqs]
        self.waiting.extend(reqs)
        self.total_requests += len(reqs)
        self.wake.set()
        try:
            done = await asyncio.gather(*futures)
        except asyncio.CancelledError:  # client went away
            for req in reqs:
                self._abort(req.rid)
            raise
        except Exception as exc:
            return bad_request(f"generation failed: {exc}", status=500)
        results = [self._response(req, len(req.prompt_ids)) for req in done]
        return web.json_response(results if batched else results[0])

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        """200 once a one-token probe finishes or the running batch makes progress (SGLang: any
        scheduler output after the check began). Batches here run to completion, so a probe queued
        behind a long batch would otherwise wait for all of it and a busy engine would look dead."""
        if self.paused is not None:
            return web.Response(text="")  # paused on purpose: alive, not stuck
        assert self.loop is not None
        began = time.monotonic()
        req = self._make_request(
            [self.engine.pad_token_id],
            SamplingParams(max_new_tokens=1, temperature=0),
            False,
            f"HEALTH_CHECK_{uuid.uuid4().hex}",
        )
        future = self.loop.create_future()
        self.futures[req.rid] = future
        self.waiting.append(req)
        self.wake.set()
        deadline = began + self.health_timeout_s
        while not future.done():
            remaining = deadline - time.monotonic()
            if self.engine.last_step_s > began or remaining <= 0:
                break
            await asyncio.wait([future], timeout=min(0.2, remaining))
        healthy = future.done() or self.engine.last_step_s > began
        if not future.done():
            self._abort(req.rid)
        if healthy:
            return web.Response(text="")
        return web.Response(status=503, text=f"the engine made no progress in {self.health_timeout_s:.0f} s")

    def _server_info(self) -> dict[str, Any]:
        return {
            **self.args,
            "model_path": self.engine.model_path,
            "tokenizer_path": self.engine.tokenizer_path,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "device": str(self.engine.device),
            "weight_version": self.weight_version,
            "engine": "hf",
            "version": "rljob-hf",
            "max_total_num_tokens": self.engine.config.max_position_embeddings,
            "internal_states": [
                {
                    "paused": self.paused is not None,
                    "num_requests_total": self.total_requests,
                    # SGLang's name: requests this server runs at once (one batch of at most this many)
                    engine_api.RUNNING_CAPACITY_KEY: self.max_batch_size,
                }
            ],
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._server_info())

    async def model_info(self, request: web.Request) -> web.Response:
        config = self.engine.config
        return web.json_response(
            {
                "model_path": self.engine.model_path,
                "tokenizer_path": self.engine.tokenizer_path,
                "served_model_name": self.args.get("served_model_name") or self.engine.model_path,
                "is_generation": True,
                "weight_version": self.weight_version,
                "model_type": getattr(config, "model_type", None),
                "architectures": getattr(config, "architectures", None),
                "preferred_sampling_params": None,
            }
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        if body.get("abort_all"):
            self._abort(None)
        elif body.get("rid") is not None:
            self._abort(str(body["rid"]))
        return web.Response(status=200)

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        mode = body.get("mode") or "abort"
        if mode not in _PAUSE_MODES:
            return bad_request(f"mode must be one of {_PAUSE_MODES}")
        self.paused = mode
        if mode == "abort":
            self._abort(None)
        # wait for the running batch to reach a step boundary
        await self._wait_idle(timeout=60)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.paused = None
        self.wake.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    def _busy(self) -> bool:
        if any(not req.finished for req in self.running):
            return True
        if self.paused in (
            "abort",
            "retract",
        ):  # held requests are not in the engine (SGLang: retract frees KV)
            return False
        return bool(self.waiting)

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self._busy():
            return web.Response(
                status=400,
                text="Cache not flushed: there are running or waiting requests. Retry after they finish or pause.\n",
            )
        return web.Response(text="Cache flushed.\n")

    async def memory_noop(self, request: web.Request) -> web.Response:
        return web.json_response({"success": True, "message": "no-op on the hf engine"})

    async def loads(self, request: web.Request) -> web.Response:
        running = len(self.running)
        waiting = len(self.waiting)
        return web.json_response(
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "version": "rljob-hf",
                "dp_rank_count": 1,
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": running,
                        "num_waiting_reqs": waiting,
                        "num_total_reqs": running + waiting,
                        "num_used_tokens": sum(len(r.prompt_ids) + len(r.output_ids) for r in self.running),
                    }
                ],
                "aggregate": {
                    "total_running_reqs": running,
                    "total_waiting_reqs": waiting,
                    "total_reqs": running + waiting,
                },
            }
        )

    # ---- app ------------------------------------------------------------------------------------

    async def _startup(self, app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()
        self.scheduler = asyncio.create_task(self._schedule())

    async def _cleanup(self, app: web.Application) -> None:
        self._abort(None)
        for group in self.update_groups.values():
            group.close()
        if self.scheduler is not None:
            self.scheduler.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)  # weight payloads can be large
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.server_info)
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.model_info)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_get("/flush_cache", self.flush_cache)
        r.add_post("/flush_cache", self.flush_cache)
        self.add_weight_routes(r)
        for path in ("/release_memory_occupation", "/resume_memory_occupation"):
            r.add_get(path, self.memory_noop)
            r.add_post(path, self.memory_noop)
        r.add_get("/v1/loads", self.loads)
        return app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rljob_runtime.rollout.hf_server",
        description="rljob's transformers-backed engine (SGLang HTTP API subset).",
    )
    parser.add_argument("--model-path", required=True, help="HF directory or an offline-resolvable hub id")
    parser.add_argument("--tokenizer-path", default=None, help="tokenizer directory (default: the model's)")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="run the checkpoint's own model and tokenizer code"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    parser.add_argument(
        "--seed", type=int, default=0, help="base sampling seed (per-request sampling_seed wins)"
    )
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    from ..models.resolve import resolve_model

    model_path = resolve_model(args.model_path)
    started = time.time()
    engine = HFEngine(
        model_path,
        dtype=args.dtype,
        device=args.device,
        tokenizer_path=args.tokenizer_path,
        trust_remote_code=args.trust_remote_code,
    )
    torch.manual_seed(args.seed)
    server = HFServer(
        engine,
        seed=args.seed,
        max_batch_size=args.max_batch_size,
        args=vars(args) | {"model_path": str(model_path)},
    )
    log.info(
        "loaded %s in %.1fs; serving on http://%s:%d (pid %d)",
        model_path,
        time.time() - started,
        args.host,
        args.port,
        os.getpid(),
    )
    web.run_app(server.app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
