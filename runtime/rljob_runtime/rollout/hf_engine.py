"""The compute half of the ``hf`` rollout engine: a transformers model and a batched decode loop.

Everything here is synchronous and runs on one worker thread of ``hf_server``; the server owns the
queue, the HTTP side and the asyncio loop. Requests of one batch are left-padded, prefilled together
and decoded step by step with a shared KV cache; a finished request leaves the batch at once
(its KV rows are dropped) and its result is handed back through ``on_finish``.

Logprobs: for each generated token we return ``log_softmax(logits / temperature)[token]`` of the
model's next-token logits in float32 (the raw ``log_softmax(logits)`` when greedy), before top-k /
top-p / min-p filtering, as SGLang does. The trainer recomputes ``log_softmax(logits /
rollout.temperature)`` from the same weights (as slime does), so the train-vs-rollout gap measures
only numerics and TIS ratios start at 1.

Determinism: each request samples with its own ``torch.Generator`` seeded from
``sampling_params.sampling_seed`` when given, else from the server seed and the request's arrival
number; so a request's tokens do not depend on which other requests share its batch (up to float
rounding of padded batches). ``temperature`` 0 (or ``top_k`` 1) is greedy.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..sync.copy import copy_all

_GREEDY_EPS = 1e-6


@dataclass
class SamplingParams:
    """The SGLang sampling parameters the ``hf`` engine honours (unknown keys are ignored)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: set[int] = field(default_factory=set)
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    ignore_eos: bool = False
    sampling_seed: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SamplingParams:
        data = data or {}

        def given(key: str, default: float) -> Any:  # an explicit null means the default
            value = data.get(key)
            return default if value is None else value

        stop = data.get("stop")
        params = cls(
            temperature=float(given("temperature", 1.0)),
            top_p=float(given("top_p", 1.0)),
            top_k=int(given("top_k", -1)),
            min_p=float(data.get("min_p") or 0.0),
            max_new_tokens=int(given("max_new_tokens", 128)),
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            stop_token_ids={int(t) for t in data.get("stop_token_ids") or []},
            skip_special_tokens=bool(data.get("skip_special_tokens", True)),
            no_stop_trim=bool(data.get("no_stop_trim", False)),
            ignore_eos=bool(data.get("ignore_eos", False)),
            sampling_seed=data.get("sampling_seed"),
        )
        if params.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if params.temperature < 0:
            raise ValueError("temperature must be >= 0")
        return params

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1


@dataclass
class Request:
    """One prompt in flight. ``output_ids`` grow across retractions (pause in place / retract)."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    abort_requested: bool = False
    weight_version: str = ""
    text: str = ""  # set on finish

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class HFEngine:
    """A causal LM plus a tokenizer; ``run_batch`` decodes a batch of ``Request``s."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        dtype: str = "float32",
        device: str = "cpu",
        tokenizer_path: str | os.PathLike[str] | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        """``tokenizer_path``: model.tokenizer (None: the model's own); ``trust_remote_code``:
        model.trustRemoteCode, for the tokenizer and the model alike."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.device = torch.device(device)
        self.dtype: torch.dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.tokenizer_path, trust_remote_code=trust_remote_code
        )
        # device_map: the weights load straight onto the GPU (a CPU copy first took most of a 4B start)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path,
            dtype=self.dtype,
            device_map=str(self.device),
            trust_remote_code=trust_remote_code,
        )
        self.model.eval()
        self.config = self.model.config
        eos: set[int] = set()
        for source in (
            getattr(self.model.generation_config, "eos_token_id", None),
            self.tokenizer.eos_token_id,
        ):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list):
                eos.update(int(t) for t in source)
        self.eos_token_ids = eos
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else next(iter(eos), 0))
        self.lock = threading.Lock()  # held by run_batch and the weight loaders
        # time.monotonic() of the last forward pass (prefill or decode step): the server's health
        # check counts progress on the running batch as alive, as SGLang counts any scheduler output
        self.last_step_s = 0.0

    # ---- tokenization -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- weights --------------------------------------------------------------------------------

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The served tensors by HF name. Built once per model: loads copy into these same tensors,
        and ``state_dict`` walks every module (about 1 ms for a 36-layer model, paid per bucket)."""
        cached = getattr(self, "_weights", None)
        if cached is None or cached[0] is not self.model:
            # state_dict names include tied aliases (lm_head.weight) that named_parameters() dedups
            weights = {name: t.data for name, t in self.model.state_dict(keep_vars=True).items()}
            cached = self._weights = (self.model, weights)
        return cached[1]

    @torch.no_grad()
    def load_named_tensors(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the model's parameters by HF name; unknown names or shapes raise ValueError."""
        targets = self.named_weights()
        pending = []
        for name, tensor in named:
            if name not in targets:
                raise ValueError(f"unknown parameter {name!r}")
            if tuple(targets[name].shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{name}: shape {tuple(tensor.shape)} != model's {tuple(targets[name].shape)}"
                )
            pending.append((targets[name], tensor))
        with self.lock:
            copy_all(pending)
        return len(pending)

    def load_from_disk(self, model_path: str) -> int:
        """Load every ``*.safetensors`` file of an HF directory into the running model."""
        from safetensors.torch import load_file

        files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
        if not files:
            raise ValueError(f"no *.safetensors files in {model_path}")
        count = 0
        for file in files:
            count += self.load_named_tensors(load_file(file).items())
        self.model_path = str(Path(model_path))
        return count

    # ---- generation ---------------------------------------------------------------------------

    def _pick(self, logits: torch.Tensor, reqs: list[Request]) -> tuple[list[int], list[float]]:
        """Choose one token per row; return the tokens and their logprobs as SGLang reports them:
        under the temperature-scaled distribution (before top-k/top-p), untempered when greedy. The
        trainer recomputes log_softmax(logits / rollout.temperature), so TIS ratios start at 1."""
        logits = logits.float()
        tokens: list[int] = []
        token_logprobs: list[float] = []
        for row, req in enumerate(reqs):
            p = req.params
            if p.greedy:
                token = int(torch.argmax(logits[row]))
                tokens.append(token)
                token_logprobs.append(float(torch.log_softmax(logits[row], dim=-1)[token]))
                continue
            scores = logits[row] / p.temperature
            tempered = torch.log_softmax(scores, dim=-1)
            if p.top_k > 0 and p.top_k < scores.numel():
                kth = torch.topk(scores, p.top_k).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            if p.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                cumulative = torch.cumsum(sorted_probs, dim=-1)
                drop = cumulative - sorted_probs > p.top_p
                sorted_probs = sorted_probs.masked_fill(drop, 0.0)
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            if p.min_p > 0.0:
                probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
            token = int(torch.multinomial(probs, 1, generator=req.generator))
            tokens.append(token)
            token_logprobs.append(float(tempered[token]))
        return tokens, token_logprobs

    def _check_finish(self, req: Request, token: int) -> None:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            req.finish_reason = {"type": "stop", "matched": token}
            return
        if p.stop:
            tail = self.decode(req.output_ids[-64:], skip_special_tokens=p.skip_special_tokens)
            for stop in p.stop:
                if stop and stop in tail:
                    req.finish_reason = {"type": "stop", "matched": stop}
                    return
        if len(req.output_ids) >= p.max_new_tokens:
            req.finish_reason = {"type": "length", "length": len(req.output_ids)}

    def finalize_text(self, req: Request) -> None:
        """Set ``req.text`` from its output, trimming the stop string / stop token as SGLang does."""
        p = req.params
        ids = req.output_ids
        matched = (req.finish_reason or {}).get("matched")
        if isinstance(matched, int) and not p.no_stop_trim and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self.decode(ids, skip_special_tokens=p.skip_special_tokens)
        if isinstance(matched, str) and not p.no_stop_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        req.text = text

    @torch.no_grad()
    def run_batch(
        self,
        reqs: list[Request],
        *,
        should_yield: Callable[[], bool],
        on_finish: Callable[[Request], None],
        weight_version: Callable[[], str],
    ) -> None:
        """Decode ``reqs`` until each finishes, is aborted, or ``should_yield()`` (pause) says stop.

        Requests that are neither finished nor aborted when it yields keep their partial output and
        are re-prefilled (prompt + output so far) by a later call.
        """
        with self.lock:
            self._run_batch_locked(reqs, should_yield, on_finish, weight_version)

    def _finish(self, req: Request, on_finish: Callable[[Request], None], version: str) -> None:
        req.weight_version = version
        self.finalize_text(req)
        on_finish(req)

    def _run_batch_locked(
        self,
        reqs: list[Request],
        should_yield: Callable[[], bool],
        on_finish: Callable[[Request], None],
        weight_version: Callable[[], str],
    ) -> None:
        active: list[Request] = []
        for req in reqs:
            if req.abort_requested:
                req.finish_reason = {"type": "abort", "message": "Abort before prefill"}
            elif len(req.output_ids) >= req.params.max_new_tokens:
                req.finish_reason = {"type": "length", "length": len(req.output_ids)}
            if req.finished:
                self._finish(req, on_finish, weight_version())
            else:
                active.append(req)
        if not active:
            return
        seqs = [req.prompt_ids + req.output_ids for req in active]
        width = max(len(seq) for seq in seqs)
        input_ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            input_ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache = out.past_key_values
        self.last_step_s = time.monotonic()
        logits = out.logits[:, -1, :]
        last_pos = positions[:, -1]
        while True:
            tokens, token_logprobs = self._pick(logits, active)
            version = weight_version()
            keep: list[int] = []
            for row, (req, token, logprob) in enumerate(zip(active, tokens, token_logprobs, strict=True)):
                req.output_ids.append(token)
                req.output_logprobs.append(logprob)
                if req.abort_requested:
                    req.finish_reason = {"type": "abort", "message": "Abort in waiting queue"}
                else:
                    self._check_finish(req, token)
                if req.finished:
                    self._finish(req, on_finish, version)
                else:
                    keep.append(row)
            if not keep:
                return
            if should_yield():
                return  # the caller re-queues the unfinished requests
            if len(keep) < len(active):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask = mask[index]
                last_pos = last_pos[index]
                tokens = [tokens[i] for i in keep]
                active = [active[i] for i in keep]
            mask = torch.cat(
                [mask, torch.ones((len(active), 1), dtype=mask.dtype, device=self.device)], dim=1
            )
            last_pos = last_pos + 1
            step_ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=last_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            self.last_step_s = time.monotonic()
            logits = out.logits[:, -1, :]
