"""The hf engine's decode loop in-process: stop strings, batching invariance, Qwen2 tiny models."""

from __future__ import annotations

import pytest
import torch

from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.rollout.hf_engine import HFEngine, Request, SamplingParams

PROMPT = [1780, 314, 216, 34, 27, 35, 47]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> HFEngine:
    return HFEngine(make_tiny_model(tmp_path_factory.mktemp("qwen") / "m", arch="qwen2", seed=3))


def _run(engine: HFEngine, reqs: list[Request]) -> list[Request]:
    done: list[Request] = []
    engine.run_batch(reqs, should_yield=lambda: False, on_finish=done.append, weight_version=lambda: "v")
    return done


def _req(rid: str, params: dict, prompt: list[int] = PROMPT, seed: int = 0) -> Request:
    return Request(
        rid=rid,
        prompt_ids=prompt,
        params=SamplingParams.from_json(params),
        return_logprob=True,
        generator=torch.Generator().manual_seed(seed),
    )


def test_qwen2_tiny_model_loads(engine: HFEngine) -> None:
    assert engine.config.model_type == "qwen2"
    assert engine.model.get_input_embeddings().weight.shape[0] == 49152


def test_stop_string_trimmed_unless_no_stop_trim(engine: HFEngine) -> None:
    (free,) = _run(engine, [_req("a", {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})])
    stop = engine.decode(free.output_ids[3:4]).strip() or engine.decode(free.output_ids[3:4])
    assert stop
    (cut,) = _run(
        engine, [_req("b", {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True, "stop": [stop]})]
    )
    assert cut.finish_reason == {"type": "stop", "matched": stop}
    assert stop not in cut.text and free.text.startswith(cut.text)
    (kept,) = _run(
        engine,
        [
            _req(
                "c",
                {
                    "temperature": 0,
                    "max_new_tokens": 8,
                    "ignore_eos": True,
                    "stop": stop,
                    "no_stop_trim": True,
                },
            )
        ],
    )
    assert kept.text.endswith(stop) or stop in kept.text


def test_batch_does_not_change_a_seeded_request(engine: HFEngine) -> None:
    params = {"temperature": 1.0, "top_k": 50, "max_new_tokens": 12, "ignore_eos": True}
    (alone,) = _run(engine, [_req("x", params, seed=5)])
    batch = _run(engine, [_req("y", params, prompt=[5, 6], seed=1), _req("x2", params, seed=5)])
    together = next(r for r in batch if r.rid == "x2")
    assert together.output_ids == alone.output_ids
    assert together.output_logprobs == pytest.approx(alone.output_logprobs, abs=1e-4)


def test_zero_tokens_and_bad_params(engine: HFEngine) -> None:
    (req,) = _run(engine, [_req("z", {"max_new_tokens": 0})])
    assert req.output_ids == [] and req.finish_reason == {"type": "length", "length": 0}
    with pytest.raises(ValueError):
        SamplingParams.from_json({"top_p": 0})


def test_logprobs_are_under_the_sampling_temperature(engine: HFEngine) -> None:
    """As SGLang reports them and the trainer recomputes them: log_softmax(logits / T), untempered
    when greedy (a teacher-forced pass over the same tokens gives the same numbers)."""
    for temperature in (0.0, 0.5, 1.0):
        params = {"temperature": temperature, "max_new_tokens": 6, "ignore_eos": True}
        (req,) = _run(engine, [_req(f"t{temperature}", params, seed=11)])
        ids = torch.tensor([PROMPT + req.output_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(PROMPT) - 1 : -1].float()
        scale = temperature if temperature > 0 else 1.0
        forced = torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(req.output_ids)[:, None])[:, 0]
        assert req.output_logprobs == pytest.approx(forced.tolist(), abs=2e-4), temperature


def test_loads_go_into_the_served_tensors_and_refuse_bad_names(engine: HFEngine) -> None:
    weights = engine.named_weights()
    assert engine.named_weights() is weights  # built once: state_dict per bucket cost ~1 ms each
    name = "model.norm.weight"
    before = weights[name].clone()
    new = torch.full_like(before, 0.5, dtype=torch.float64)  # a cast on the way in
    try:
        assert engine.load_named_tensors([(name, new)]) == 1
        assert torch.equal(engine.model.state_dict()[name], new.to(before.dtype))
        with pytest.raises(ValueError, match="unknown parameter 'nope'"):
            engine.load_named_tensors([("nope", new)])
        with pytest.raises(ValueError, match="shape"):
            engine.load_named_tensors([(name, new[:-1])])
    finally:
        engine.load_named_tensors([(name, before)])
