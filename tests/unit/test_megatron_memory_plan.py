"""trainer/megatron/memory_plan.py: the per-GPU estimate and the refusal of a layout that cannot fit,
with the figures and the options that would fit (issue #18's "bad input")."""

from __future__ import annotations

from typing import Any

import pytest

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.trainer.megatron.arch import model_shape
from rljob_runtime.trainer.megatron.memory_plan import (
    GiB,
    Knobs,
    check_fits,
    estimate,
    knobs_from_spec,
    stage_params,
)
from rljob_runtime.trainer.megatron.parallel import Parallelism

# Qwen3-4B's and Qwen3-8B's published shapes.
QWEN3_4B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
QWEN3_8B = {
    **QWEN3_4B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "tie_word_embeddings": False,
}
H100 = int(79.2 * GiB)


def _spec(gpus: int = 1, **training: Any) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/m", "dtype": "bfloat16"},
            "data": {"path": "/d.jsonl", "maxPromptLength": 512},
            "rollout": {"engine": "sglang", "batchSize": 8, "nSamplesPerPrompt": 8, "maxResponseLen": 3584},
            "training": {"backend": "megatron", "globalBatchSize": 64, **training},
            "resources": {"device": "cuda", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": gpus}},
        }
    )


def test_parameter_counts_match_the_published_sizes() -> None:
    params_4b, largest = stage_params(model_shape(QWEN3_4B), tp=1, pp=1)
    assert abs(params_4b - 4.02e9) / 4.02e9 < 0.01
    assert largest == 151936 * 2560  # the (tied) embedding
    params_8b, _ = stage_params(model_shape(QWEN3_8B), tp=1, pp=1)
    assert abs(params_8b - 8.19e9) / 8.19e9 < 0.01
    half, _ = stage_params(model_shape(QWEN3_8B), tp=2, pp=1)
    assert abs(half - params_8b / 2) / half < 0.01  # norms are not split: a rounding error


def test_4b_full_adam_does_not_fit_an_h100_and_offload_does() -> None:
    shape = model_shape(QWEN3_4B)
    with pytest.raises(ValueError) as err:
        check_fits(shape, _spec(), Parallelism(), H100)
    text = str(err.value)
    assert "does not fit a 79.2 GiB GPU" in text
    assert "optimizer 45.0" in text  # 12 bytes x 4.02 B parameters
    assert "training.offloadOptimizer: true" in text and "(fits)" in text
    fits = check_fits(shape, _spec(offloadOptimizer=True), Parallelism(), H100)
    assert fits.total < H100
    assert fits.weights == 2 * stage_params(shape, 1, 1)[0]


def test_8b_fits_two_gpus_at_tp2_with_offload_and_recompute_only() -> None:
    shape = model_shape(QWEN3_8B)
    spec = _spec(2, parallelism={"tensor": 2})
    par = Parallelism(tp=2)
    with pytest.raises(ValueError, match="tensor 2 x pipeline 1 x data 1"):
        check_fits(shape, spec, par, H100)
    check_fits(
        shape,
        _spec(2, parallelism={"tensor": 2}, offloadOptimizer=True, recomputeActivations=True),
        par,
        H100,
    )


def test_each_knob_moves_the_estimate_the_right_way() -> None:
    shape = model_shape(QWEN3_4B)
    base = Knobs(
        tp=1,
        pp=1,
        dp=1,
        micro_tokens=4096,
        recompute=False,
        offload_optimizer=False,
        reference=False,
        colocated=False,
    )
    total = estimate(shape, base).total
    from dataclasses import replace

    assert estimate(shape, replace(base, dp=2)).optimizer == estimate(shape, base).optimizer // 2
    assert estimate(shape, replace(base, recompute=True)).activations < estimate(shape, base).activations / 10
    assert (
        estimate(shape, replace(base, micro_tokens=8192)).activations == 2 * estimate(shape, base).activations
    )
    assert estimate(shape, replace(base, reference=True)).total > total
    assert estimate(shape, replace(base, colocated=True)).overhead == estimate(shape, base).overhead + 2 * GiB
    assert estimate(shape, replace(base, tp=2)).weights < 0.51 * estimate(shape, base).weights


def test_dynamic_batch_counts_its_token_budget() -> None:
    shape = model_shape(QWEN3_4B)
    small = check_fits(shape, _spec(offloadOptimizer=True, lmHead="full"), Parallelism(), H100)
    # The prompt (maxPromptLength 512) and response (3584) make 4096 tokens per micro-batch of 1.
    assert small.logits == 10 * 4096 * 151936


def test_megatron_args_full_recompute_counts_as_recompute() -> None:
    from rljob_runtime.trainer.megatron.memory_plan import knobs_from_spec

    spec = _spec(megatronArgs={"recompute-granularity": "full"})
    assert knobs_from_spec(spec, Parallelism()).recompute
    assert not knobs_from_spec(_spec(), Parallelism()).recompute


def test_a_ppo_critic_adds_its_weights_gradients_and_optimizer_state() -> None:
    shape = model_shape(QWEN3_4B)
    grpo = estimate(shape, knobs_from_spec(_spec(offloadOptimizer=True), Parallelism()))
    spec = _spec(offloadOptimizer=True)
    ppo = spec.model_copy(
        update={"algorithm": spec.algorithm.model_copy(update={"advantage_estimator": "ppo"})}
    )
    with_critic = estimate(shape, knobs_from_spec(ppo, Parallelism()))
    assert grpo.critic == 0
    assert with_critic.critic == grpo.weights + grpo.gradients + grpo.optimizer
    assert with_critic.total == grpo.total + with_critic.critic


# Qwen3-30B-A3B's published shape: every layer MoE, 128 experts, 8 per token.
QWEN3_30B_A3B: dict[str, Any] = {
    **QWEN3_4B,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,  # no dense layer uses it
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# By hand, per layer: attention qkv 2048 x (4096 + 2 x 512) = 10,485,760, proj 4096 x 2048 = 8,388,608,
# two norms 2 x 2048 and the q/k norms 2 x 128: 18,878,720; the router 128 x 2048 = 262,144; one
# expert (gate, up, down) 3 x 2048 x 768 = 4,718,592. Embedding and output layer 2 x 151936 x 2048
# = 622,329,856, the final norm 2048.
ATTENTION, ROUTER, EXPERT = 18_878_720, 262_144, 4_718_592
DENSE_30B = 48 * (ATTENTION + ROUTER) + 622_329_856 + 2048  # = 1,541,093,376


@pytest.mark.parametrize(
    ("ep", "experts"),
    [(1, 48 * 128 * EXPERT), (8, 48 * 16 * EXPERT)],  # 28,991,029,248 and 3,623,878,656
)
def test_moe_parameters_count_the_router_and_this_ep_rank_s_experts(ep: int, experts: int) -> None:
    from rljob_runtime.trainer.megatron.memory_plan import stage_param_counts

    counts = stage_param_counts(model_shape(QWEN3_30B_A3B), tp=1, pp=1, ep=ep)
    assert (counts.dense, counts.experts) == (1_541_093_376, experts) == (DENSE_30B, experts)
    assert counts.largest == 151936 * 2048  # the embedding
    assert stage_params(model_shape(QWEN3_30B_A3B), 1, 1, ep) == (counts.total, counts.largest)
    if ep == 1:
        assert counts.total == 30_532_122_624  # the model card's 30.5 B


def test_moe_estimate_by_hand_at_ep1_and_ep8() -> None:
    shape = model_shape(QWEN3_30B_A3B)
    base = Knobs(
        tp=1,
        pp=1,
        dp=8,
        micro_tokens=4096,
        recompute=False,
        offload_optimizer=False,
        reference=False,
        colocated=False,
    )
    from dataclasses import replace

    ep1, ep8 = estimate(shape, base), estimate(shape, replace(base, ep=8))
    assert (ep1.weights, ep1.gradients) == (2 * 30_532_122_624, 4 * 30_532_122_624)
    assert (ep8.weights, ep8.gradients) == (2 * 5_164_972_032, 4 * 5_164_972_032)
    # The dense part's 12 bytes over 8 data-parallel ranks; the experts' over the ranks holding the same
    # experts: 8 at EP 1, 1 at EP 8 (which holds 1/8 of them). The same total either way.
    assert ep1.optimizer == 12 * DENSE_30B // 8 + 12 * 48 * 128 * EXPERT // 8 == 45_798_183_936
    assert ep8.optimizer == 12 * DENSE_30B // 8 + 12 * 48 * 16 * EXPERT // 1 == 45_798_183_936
    # Per token and layer: 2 bytes x (6 x 2048 + 2 x 5120 + 8 x (3 x 768 + 2 x 2048) + 128) = 147,712
    # (the dense formula with the 6144-wide MLP would say 81,920); balanced routing: EP does not change it.
    assert ep1.activations == ep8.activations == 147_712 * 4096 * 48
    assert estimate(shape, replace(base, recompute=True)).activations == 4096 * (2 * 2048 * 48 + 147_712)


def test_the_memory_check_counts_experts() -> None:
    shape = model_shape(QWEN3_30B_A3B)
    spec = _spec(8, offloadOptimizer=True, recomputeActivations=True)
    with pytest.raises(ValueError) as err:  # every expert on every GPU: 57 GiB of bf16 weights alone
        check_fits(shape, spec, Parallelism(dp=8), H100)
    assert "weights 56.9, gradients 113.7" in str(err.value)
    assert "training.parallelism.tensor" not in str(err.value)  # MoE with tensor > 1 is refused
    fits = check_fits(shape, spec, Parallelism(dp=8, ep=8), H100)  # 16 experts per GPU
    assert fits.weights == 2 * 5_164_972_032


def test_dense_layers_of_an_moe_model_and_the_stage_with_most_experts() -> None:
    from rljob_runtime.trainer.megatron.memory_plan import stage_param_counts

    half = model_shape({**QWEN3_30B_A3B, "mlp_only_layers": list(range(24))})  # layers 0-23 dense
    counts = stage_param_counts(half, tp=1, pp=2, ep=1)
    # The second stage: 24 MoE layers and the output layer (151936 x 2048) and the final norm.
    assert counts.dense == 24 * (ATTENTION + ROUTER) + 151936 * 2048 + 2048
    assert counts.experts == 24 * 128 * EXPERT
    whole = stage_param_counts(half, tp=1, pp=1, ep=1)
    assert whole.dense == 48 * ATTENTION + 24 * ROUTER + 24 * 3 * 2048 * 6144 + 622_329_856 + 2048
    assert whole.largest == max(151936 * 2048, 3 * 2048 * 6144)
