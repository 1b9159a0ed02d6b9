"""Rollout routing replay (training.routingReplay, trainer/megatron/routing_replay.py) on CPU.

The routing record is a stand-in for SGLang's: for every token and MoE layer, k distinct experts drawn
at random (not the ones the model would choose), encoded as SGLang's detokenizer encodes
``meta_info.routed_experts`` (base64 of the int32 [tokens - 1, layers, k] array). The reference is
transformers' Qwen3MoeForCausalLM with each MoE layer's router forced to the record's experts (its
softmax gathered at them, renormalised as the config says: what SGLang and megatron-core's
``RouterReplay`` compute). The megatron backend's real rank (one gloo rank, float32) must give exactly
those log-probs, in the padded and the packed (dynamicBatch) layout, and train on them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from test_megatron_moe import hf_model
from test_megatron_moe_rank import MOE
from test_megatron_reshard import cpu_training, trainer

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime import engine_api
from rljob_runtime.data.sample import Sample
from rljob_runtime.rollout.generate import apply_response, request_body
from rljob_runtime.trainer.base import build_batch
from rljob_runtime.trainer.megatron.checks import check_layout
from rljob_runtime.trainer.megatron.routing_replay import replay_targets

LAYERS, TOPK, EXPERTS = MOE["num_hidden_layers"], MOE["num_experts_per_tok"], MOE["num_experts"]


def sglang_record(routes: torch.Tensor) -> str:
    """SGLang's encoding (detokenizer_manager._b64_encode_per_request): base64 of the int32 bytes."""
    return base64.b64encode(routes.to(torch.int32).numpy().tobytes()).decode("utf-8")


def stand_in_routes(tokens: int, seed: int) -> torch.Tensor:
    """int32 [tokens - 1, layers, k]: k distinct random experts per token and layer."""
    gen = torch.Generator().manual_seed(seed)
    picks = [torch.randperm(EXPERTS, generator=gen)[:TOPK] for _ in range((tokens - 1) * LAYERS)]
    return torch.stack(picks).view(tokens - 1, LAYERS, TOPK).to(torch.int32)


def make_samples() -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        prompt = torch.randint(0, MOE["vocab_size"], (3 + i % 3,), generator=gen).tolist()
        response = torch.randint(0, MOE["vocab_size"], (4 + i % 4,), generator=gen).tolist()
        routes = stand_in_routes(len(prompt) + len(response), seed=100 + i)
        out.append(
            Sample(
                group_index=i // 4,
                prompt_ids=prompt,
                response_ids=response,
                loss_mask=[1] * len(response),
                rollout_routed_experts=sglang_record(routes),
            )
        )
    return out


# ---------------------------------------------------------------------------------- the record


def test_a_record_decodes_to_rows_of_layers_times_k_and_a_wrong_one_is_refused() -> None:
    routes = stand_in_routes(6, seed=1)
    got = engine_api.routed_experts(sglang_record(routes), 6)
    assert got.dtype == torch.int32 and torch.equal(got, routes.view(5, LAYERS * TOPK))
    with pytest.raises(ValueError, match="is not int32 rows for 8 - 1 = 7 tokens"):
        engine_api.routed_experts(sglang_record(routes), 8)  # 30 ints in 7 rows: no
    # 6 rows of 5 fit the bytes: the rank's replay_targets refuses that width (test below)
    assert engine_api.routed_experts(sglang_record(routes), 7).shape == (6, 5)


def test_the_request_asks_for_routes_and_the_answer_s_record_replaces_the_sample_s() -> None:
    sample = Sample(index=0, prompt_ids=[1, 2, 3])
    params = engine_api.sampling_params(max_new_tokens=4)
    assert "return_routed_experts" not in request_body(sample, params)
    assert request_body(sample, params, routed_experts=True)["return_routed_experts"] is True
    first = sglang_record(stand_in_routes(5, seed=2))
    answer: dict[str, Any] = {
        "text": "ab",
        "meta_info": {
            "finish_reason": {"type": "abort"},
            "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None]],
            "routed_experts": first,
        },
    }
    apply_response(sample, answer)
    assert sample.rollout_routed_experts == first
    # continued: the new answer's record covers prompt + both segments, and replaces the old one
    whole = sglang_record(stand_in_routes(7, seed=3))
    answer = {
        "text": "cd",
        "meta_info": {
            "finish_reason": {"type": "length"},
            "output_token_logprobs": [[-0.3, 9, None], [-0.4, 10, None]],
            "routed_experts": whole,
        },
    }
    apply_response(sample, answer)
    assert sample.rollout_routed_experts == whole and len(sample.tokens) == 7
    del answer["meta_info"]["routed_experts"]
    apply_response(Sample(index=1, prompt_ids=[1]), answer)  # no record: None, not a stale one
    assert build_batch([sample]).routed_experts is not None


def test_the_batch_keeps_records_only_when_every_sample_has_one() -> None:
    samples = make_samples()
    batch = build_batch(samples)
    assert batch.routed_experts is not None and len(batch.routed_experts) == 8
    picked = batch.select([5, 2])
    assert picked.routed_experts == [samples[5].rollout_routed_experts, samples[2].rollout_routed_experts]
    samples[3].rollout_routed_experts = None
    assert build_batch(samples).routed_experts is None


@pytest.mark.parametrize("packed", [False, True])
def test_targets_follow_the_router_s_token_order(packed: bool) -> None:
    """Padded: the router sees [s, b] flattened, token ``t = i * b + j`` (position i of row j); packed:
    the rows end to end. Each row's last token and the padding get experts 0..k-1."""
    batch = build_batch(make_samples()[:3])  # 3 + 4 + 5 + 6 ... tokens
    targets = replay_targets(batch, layers=LAYERS, topk=TOPK, experts=EXPERTS, packed=packed)
    lengths = batch.sequence_lengths()
    width, rows = int(batch.input_ids.shape[1]), batch.size
    assert batch.routed_experts is not None
    offset = 0
    for j, n in enumerate(lengths):
        record = engine_api.routed_experts(batch.routed_experts[j], n).view(n - 1, LAYERS, TOPK).long()
        for i in range(width if not packed else n):
            got = targets[offset + i] if packed else targets[i * rows + j]
            want = record[i] if i < n - 1 else torch.arange(TOPK).expand(LAYERS, TOPK)
            assert torch.equal(got, want), (j, i)
        offset += n
    assert targets.shape[0] == (sum(lengths) if packed else width * rows)


def test_a_record_of_another_model_is_refused_by_name() -> None:
    samples = make_samples()[:2]
    samples[1].rollout_routed_experts = sglang_record(stand_in_routes(4, seed=4))  # 18 ints for 9 tokens
    with pytest.raises(
        ValueError, match=r"training\.routingReplay: row 1: a routed-experts record of 72 bytes"
    ):
        replay_targets(build_batch(samples), layers=LAYERS, topk=TOPK, experts=EXPERTS, packed=False)
    batch = build_batch(make_samples()[:2])
    with pytest.raises(
        ValueError, match=r"row 0's routing record is \(\d+, 6\), not \(\d+, 3 layers x top-4\)"
    ):
        replay_targets(batch, layers=LAYERS, topk=4, experts=EXPERTS, packed=False)
    with pytest.raises(ValueError, match=r"the model has experts 0\.\.1"):
        replay_targets(batch, layers=LAYERS, topk=TOPK, experts=2, packed=False)
    batch.routed_experts = None
    with pytest.raises(ValueError, match=r"training\.routingReplay: a sample has no routing record"):
        replay_targets(batch, layers=LAYERS, topk=TOPK, experts=EXPERTS, packed=False)


# ----------------------------------------------------------------------- the megatron rank


@pytest.fixture(autouse=True)
def accept_routing_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's support matrix without its refusal of routingReplay until it has run on GPUs (its
    other limits stay)."""
    from rljob_api import support

    monkeypatch.setattr(support, "LIMITS", tuple(lim for lim in support.LIMITS if not _not_yet_on_gpus(lim)))


def _not_yet_on_gpus(limit: Any) -> bool:
    return limit.field == ".training.routingReplay" and "not yet shown on GPUs" in limit.what


def replay_spec(model_dir: Path, *, replay: bool = True, dynamic: bool = False) -> RLTrainingJobSpec:
    """A one-GPU megatron job on the tiny MoE with training.routingReplay ``replay`` (set on a copy, not
    re-validated: admission refuses it until it has run on GPUs)."""
    spec = RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model_dir), "dtype": "float32"},
            "data": {"path": "/unused.jsonl", "maxPromptLength": 8},
            "algorithm": {"useKLLoss": True, "klLossCoef": 0.01, "lossReduction": "token"},
            "rollout": {"engine": "sglang", "batchSize": 2, "nSamplesPerPrompt": 4, "maxResponseLen": 8},
            "training": {
                "backend": "megatron",
                "globalBatchSize": 8,
                "microBatchSize": 1 if dynamic else 2,
                "dynamicBatch": {"enabled": dynamic, "maxTokensPerGpu": 40},
                "optimizer": {"lr": 1e-3, "clipGrad": 0.0},
            },
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )
    return spec.model_copy(update={"training": spec.training.model_copy(update={"routing_replay": replay})})


def forced_reference_logprobs(model: Any, samples: list[Sample], forced: bool) -> list[torch.Tensor]:
    """transformers' log-probs of each sample's response, one sample at a time (no padding), each MoE
    layer's router forced to the sample's record (``forced``) or left to choose."""
    out = []
    for sample in samples:
        n = len(sample.tokens)
        routes = engine_api.routed_experts(str(sample.rollout_routed_experts), n).view(n - 1, LAYERS, TOPK)
        chosen = torch.cat([routes.long(), torch.arange(TOPK).expand(1, LAYERS, TOPK)])  # last: any
        undo = []
        for index, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is None or not forced:
                continue

            def route(
                hidden: torch.Tensor, gate: Any = gate, index: int = index, chosen: torch.Tensor = chosen
            ) -> Any:
                logits = torch.nn.functional.linear(hidden.reshape(-1, gate.hidden_dim), gate.weight)
                probs = torch.softmax(logits, dim=-1, dtype=torch.float)
                picked = chosen[:, index]
                weights = probs.gather(1, picked)
                if gate.norm_topk_prob:
                    weights = weights / weights.sum(dim=-1, keepdim=True)
                return logits, weights.to(logits.dtype), picked

            gate.forward = route
            undo.append(gate)
        try:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].float()
        finally:
            for gate in undo:
                del gate.forward
        p = len(sample.prompt_ids)
        logp = torch.log_softmax(logits[p - 1 : n - 1], dim=-1)
        out.append(logp.gather(1, torch.tensor(sample.response_ids)[:, None])[:, 0])
    return out


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    path = tmp_path_factory.mktemp("routing-replay") / "hf"
    _, _, reference = hf_model(path, **MOE)
    yield path, reference


def test_a_dense_model_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    from rljob_runtime.trainer.megatron.testing import SMOLLM2_135M

    config = {**SMOLLM2_135M, "architectures": ["LlamaForCausalLM"]}
    with pytest.raises(ValueError, match=r"training.routingReplay .* is dense \(no experts\); set it false"):
        check_layout(replay_spec(tmp_path), config, 1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["padded", "packed"])
def test_the_rank_replays_the_record_in_logprobs_and_training(
    moe_dir: tuple[Path, Any], cpu_megatron: None, dynamic: bool
) -> None:
    path, reference = moe_dir
    undo = cpu_training()
    try:
        samples = make_samples()
        batch = build_batch(samples)
        forced = forced_reference_logprobs(reference, samples, forced=True)
        natural = forced_reference_logprobs(reference, samples, forced=False)
        assert min(float((f - n).abs().max()) for f, n in zip(forced, natural, strict=True)) > 1e-3

        rank = trainer(replay_spec(path, dynamic=dynamic), path, 0, 1)
        lp = rank.logprobs(batch)
        for i, want in enumerate(forced):
            torch.testing.assert_close(lp.logp[i, : len(want)], want, rtol=1e-4, atol=1e-4, msg=f"row {i}")
            torch.testing.assert_close(
                lp.ref_logp[i, : len(want)], want, rtol=1e-4, atol=1e-4, msg=f"ref {i}"
            )

        grads: dict[str, torch.Tensor] = {}

        def record() -> tuple[bool, float, None]:
            for name, p in rank.model.module.named_parameters():
                grads[name] = p.main_grad.detach().clone()
            return True, 0.0, None

        rank.optimizer.step = record
        adv = torch.linspace(-1.0, 1.0, batch.size)[:, None] * batch.loss_mask
        metrics = rank.train(batch, adv, lp.logp, lp.ref_logp)
        assert metrics["ppo_kl"] == 0.0  # the training forward replayed the routes logprobs did
        routers = [name for name in grads if name.endswith("mlp.router.weight")]
        assert len(routers) == 2 and all(float(grads[n].abs().sum()) > 0 for n in routers)
        for _, replay in rank.replay.routers:  # nothing left behind for the next forward
            assert replay.target_topk_idx is None and replay.router_replay_action is None

        # the same rank, its routers left to choose: transformers' own routing, not the record's
        rank.replay = rank.ref_replay = None
        free = rank.logprobs(batch)
        for i, want in enumerate(natural):
            torch.testing.assert_close(free.logp[i, : len(want)], want, rtol=1e-4, atol=1e-4, msg=f"free {i}")
    finally:
        for owner, name, value in undo:
            setattr(owner, name, value)
