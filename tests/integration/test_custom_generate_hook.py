"""The calculator example hook (rollout.customGenerate) through a real RolloutManager: SmolLM2-135M-
Instruct on one hf engine behind the real sglang-router, on a local Ray.

Greedy decoding of the example's few-shot prompts makes the real model call the tool, so the test
checks on real tokens that every masked-out run decodes to exactly the tool's answer to the call
before it, that model tokens carry the engine's logprobs (equal to a teacher-forced recomputation
over the whole multi-turn sequence: nothing was re-tokenized) and tool tokens 0.0; and that
``abort()`` ends hook samples aborted and consistent.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import groupby, pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from rollout_on_ray import rollout_on_ray

from rljob_runtime.config import config_from_document
from rljob_runtime.data.sample import Sample, Status
from rljob_runtime.models.resolve import resolve_model
from rljob_runtime.models.smollm2 import SMOLLM2_REF
from rljob_runtime.rollout.generate import RetryPolicy
from rljob_runtime.rollout.manager import RolloutManager

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "examples" / "hooks"
DATA = REPO / "examples" / "data" / "calc-2digit.jsonl"
sys.path.insert(0, str(HOOKS))  # what PYTHONPATH=examples/hooks does for the runtime
import calculator_tool  # noqa: E402

pytestmark = pytest.mark.slow


@dataclass
class Env:
    manager: RolloutManager
    model: Path
    tokenizer: Any


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("hook")
    model = resolve_model(SMOLLM2_REF)
    doc = {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {"path": str(DATA)},
        "rollout": {
            "engine": "hf",
            "batchSize": 4,
            "nSamplesPerPrompt": 1,
            "maxResponseLen": 64,
            "customGenerate": "calculator_tool:generate",
        },
        "training": {"backend": "torch", "globalBatchSize": 4, "microBatchSize": 1},
        "resources": {"device": "cpu", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": 1}},
        "faultTolerance": {"engineHealthCheck": {"firstWaitSeconds": 600}},
    }
    spec = config_from_document(doc).spec
    with rollout_on_ray(
        spec, model, tmp / "logs", retry=RetryPolicy(max_attempts=30, backoff_s=0.5)
    ) as manager:
        yield Env(manager, model, transformers.AutoTokenizer.from_pretrained(str(model)))


def prompts(tokenizer: Any, n: int) -> list[Sample]:
    """The example's first ``n`` prompts, rendered and tokenized as the data source does."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:n]]
    samples = []
    for i, row in enumerate(rows):
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        samples.append(Sample(group_index=i, index=i, prompt=text, prompt_ids=ids, label=row["label"]))
    return samples


def running(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/loads", timeout=30) as response:
        return int(json.loads(response.read())["loads"][0]["num_running_reqs"])


def runs(sample: Sample) -> list[tuple[int, list[int]]]:
    """(mask value, token ids) for each run of equal loss mask values, in order."""
    assert sample.loss_mask is not None
    pairs = zip(sample.loss_mask, sample.response_ids, strict=True)
    return [(m, [t for _, t in group]) for m, group in groupby(pairs, key=lambda p: p[0])]


def test_tool_turns_are_masked_and_decode_to_the_tools_answers(env: Env) -> None:
    tok = env.tokenizer
    samples = prompts(tok, 4)
    started = time.monotonic()
    out = env.manager.generate(samples, temperature=0.0)
    print(f"4 multi-turn samples in {time.monotonic() - started:.1f} s")
    assert out == samples
    calls = 0
    for sample in out:
        print(sample.label, repr(tok.decode(sample.response_ids)))
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED), sample
        n = sample.response_length
        assert 0 < n == len(sample.response_ids) == len(sample.loss_mask or []) <= 64
        assert sample.rollout_logprobs is not None and len(sample.rollout_logprobs) == n
        segments = runs(sample)
        assert segments[0][0] == 1, "a response starts with a model turn"
        for (mask_before, before), (mask, ids) in pairwise(segments):
            if mask == 0:
                calls += 1
                assert mask_before == 1
                model_text = tok.decode(before)
                expected = calculator_tool.tool_output(calculator_tool.last_call(model_text) or "")
                # the model's last token may already hold the result's first characters ('><')
                tail = model_text[model_text.rindex("</calc>") :]
                assert len(tail) < len("</calc>") + len(expected), model_text
                assert tail + tok.decode(ids) == "</calc>" + expected, (model_text, tok.decode(ids))
        # tool tokens: logprob exactly 0.0; model tokens: the engine's (negative) logprobs
        for mask, lp in zip(sample.loss_mask or [], sample.rollout_logprobs, strict=True):
            assert (lp == 0.0) if mask == 0 else (lp <= 0.0)
        assert sample.metadata.get("tool_calls", 0) == sum(1 for m, _ in segments if m == 0)
        assert sample.tokens == sample.prompt_ids + sample.response_ids
    assert calls >= 2, "greedy SmolLM2 on the few-shot prompts should call the calculator"

    # Model-token logprobs equal a teacher-forced pass over prompt + whole response (tool turns as
    # context): the hook fed the engine exactly these tokens, nothing was re-tokenized.
    model = transformers.AutoModelForCausalLM.from_pretrained(str(env.model), dtype=torch.float32).eval()
    for sample in out[:2]:
        with torch.no_grad():
            ids = torch.tensor([sample.tokens])
            logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1]
            forced = torch.log_softmax(logits.float(), -1)
            forced = forced.gather(1, torch.tensor(sample.response_ids)[:, None])[:, 0].tolist()
        for mask, got, want in zip(
            sample.loss_mask or [], sample.rollout_logprobs or [], forced, strict=True
        ):
            if mask == 1:
                assert got == pytest.approx(want, abs=2e-3)


def test_abort_ends_hook_samples_aborted_and_consistent(env: Env) -> None:
    manager = env.manager
    samples = prompts(env.tokenizer, 4)
    # ignore_eos: every sample keeps generating (and calling the tool) until the abort
    future = manager.generate_async(samples, temperature=0.0, max_new_tokens=400, ignore_eos=True)
    url = manager.engine_urls()[0]
    deadline = time.monotonic() + 60
    while running(url) < 4:
        assert time.monotonic() < deadline and not future.done(), "the engine never ran all 4 samples"
        time.sleep(0.05)
    manager.abort()
    out = future.result(timeout=120)
    assert [s.status for s in out] == [Status.ABORTED] * 4
    for sample in out:
        n = len(sample.response_ids)
        assert (
            sample.response_length == n == len(sample.loss_mask or []) == len(sample.rollout_logprobs or [])
        )
    # the next rollout is not cancelled
    again = manager.generate(prompts(env.tokenizer, 1), temperature=0.0)
    assert again[0].status in (Status.COMPLETED, Status.TRUNCATED)
