"""Qwen3-MoE's pure parts for the megatron backend (trainer/megatron/moe.py), against the real libraries:
transformers' Qwen3MoeForCausalLM decides which layers are MoE and routes tokens, megatron-core's local
spec builds the MoE layer whose tensor names and shapes the conversion must produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from rljob_runtime.trainer.megatron.moe import (
    hf_to_megatron_moe,
    local_experts,
    moe_config_fields,
    moe_shape,
)

TINY: dict[str, Any] = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=8,
    num_experts_per_tok=2,
)


def hf_model(tmp_path: Path, **over: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    """A random tiny Qwen3MoeForCausalLM saved as a checkpoint is (config.json, safetensors on disk)."""
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**TINY, **over})).eval()
    model.save_pretrained(tmp_path)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(tmp_path.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return json.loads((tmp_path / "config.json").read_text()), state, model


@pytest.mark.parametrize(("step", "dense"), [(1, []), (1, [1]), (2, []), (2, [3])])
def test_the_moe_layers_are_the_ones_transformers_builds(tmp_path: Path, step: int, dense: list[int]) -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config, _, model = hf_model(tmp_path, decoder_sparse_step=step, mlp_only_layers=dense)
    moe = moe_shape(config)
    assert moe is not None and (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size) == (8, 2, 16)
    built = tuple(
        i for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)
    )
    assert moe.moe_layers == built and built  # some layer is MoE in every case here


def test_dense_configs_and_bad_numbers() -> None:
    assert moe_shape({"num_hidden_layers": 2}) is None
    with pytest.raises(ValueError, match=r"num_experts_per_tok 9 must be in 1\.\.num_experts"):
        moe_shape({**TINY, "num_experts_per_tok": 9})
    assert moe_shape({**TINY, "router_aux_loss_coef": 0.01}).aux_loss_coef == 0.0  # type: ignore[union-attr]
    with_logits = moe_shape({**TINY, "router_aux_loss_coef": 0.01, "output_router_logits": True})
    assert with_logits is not None and with_logits.aux_loss_coef == 0.01
    assert moe_config_fields(with_logits)["moe_router_load_balancing_type"] == "aux_loss"


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_megatron_routes_every_token_as_transformers_does(norm_topk_prob: bool) -> None:
    from types import SimpleNamespace

    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    torch.manual_seed(1)
    cfg = {**TINY, "norm_topk_prob": norm_topk_prob, "num_experts": 16, "num_experts_per_tok": 4}
    router = Qwen3MoeTopKRouter(SimpleNamespace(**cfg))
    router.weight.data.normal_()
    x = torch.randn(64, cfg["hidden_size"])
    _, weights, chosen = router(x)
    want = torch.zeros(64, 16).scatter(1, chosen, weights.float())
    fields = moe_config_fields(moe_shape({**cfg, "num_hidden_layers": 1}), cuda=False)  # type: ignore[arg-type]
    probs, mask = topk_routing_with_score_function(
        x @ router.weight.t(), 4, use_pre_softmax=fields["moe_router_pre_softmax"], score_function="softmax"
    )
    assert torch.equal(mask, want != 0)
    assert torch.allclose(probs, want, atol=1e-6)


def test_router_and_experts_convert_both_ways_with_megatron_s_names(
    tmp_path: Path, cpu_megatron: None
) -> None:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig

    from rljob_runtime.trainer.megatron import model_shape
    from rljob_runtime.trainer.megatron.convert import hf_to_megatron, megatron_to_hf
    from rljob_runtime.trainer.megatron.model import init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import Parallelism, padded_vocab_size

    config, hf, _ = hf_model(tmp_path, num_hidden_layers=2)
    moe = moe_shape(config)
    assert moe is not None and moe.moe_layers == (0, 1)
    mg = {k: v for layer in moe.moe_layers for k, v in hf_to_megatron_moe(hf, moe, layer).items()}
    # the whole checkpoint there and back (the export the engines and HF checkpoints get)
    shape = model_shape(config)
    assert shape.moe == moe
    whole = hf_to_megatron(hf, shape, padded_vocab_size(shape.vocab_size, 1), moe=moe)
    back = megatron_to_hf(whole, shape)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)

    # megatron-core's own MoE layer (local spec, SequentialMLP experts) has exactly these tensors
    init_model_parallel(Parallelism(), 0)
    tc = TransformerConfig(
        num_layers=2,
        hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"],
        num_query_groups=config["num_key_value_heads"],
        kv_channels=config["head_dim"],
        ffn_hidden_size=config["intermediate_size"],
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        qk_layernorm=True,
        params_dtype=torch.float32,
        use_cpu_initialization=True,
        **moe_config_fields(moe, cuda=False),
    )
    model = GPTModel(
        config=tc,
        transformer_layer_spec=get_gpt_decoder_block_spec(
            tc, use_transformer_engine=False, normalization="RMSNorm"
        ),
        vocab_size=128,
        max_sequence_length=64,
    )
    built = {k: tuple(v.shape) for k, v in model.named_parameters() if ".mlp." in k}
    assert built == {k: tuple(v.shape) for k, v in mg.items()}


def test_each_expert_parallel_rank_holds_a_contiguous_block() -> None:
    assert [list(local_experts(8, 2, r)) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="6 experts do not split over 4"):
        local_experts(6, 4, 0)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_a_megatron_moe_model_from_the_hf_checkpoint_gives_transformers_logits(
    tmp_path: Path, cpu_megatron: None, monkeypatch: pytest.MonkeyPatch, norm_topk_prob: bool
) -> None:
    """EP 1 on CPU: the dense parts through convert.hf_to_megatron, the MoE layers through moe.py, into
    megatron-core's local-spec MoE GPTModel (allgather dispatcher); its logits equal transformers'."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    from rljob_runtime.trainer.megatron.model import forward_logits, init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    # megatron-core 0.16.1 names te_general_gemm only when TransformerEngine imports: the router's
    # gating function then raises NameError; None selects its plain-torch path.
    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    # Layer 1 dense, the others MoE (megatron-core's block spec from moe_layer_freq)
    config, _, reference = hf_model(tmp_path, norm_topk_prob=norm_topk_prob, mlp_only_layers=[1])
    moe = moe_shape(config)
    assert moe is not None and moe.moe_layers == (0, 2, 3)
    init_model_parallel(Parallelism(), 0)
    model, shape = _moe_model(str(tmp_path), 1, 0)
    with torch.no_grad():
        ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(3))
        ours = forward_logits(model, ids, shape)
        theirs = reference(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), float((ours - theirs).abs().max())


def test_an_expert_parallel_rank_takes_its_block_renumbered() -> None:
    from rljob_runtime.trainer.megatron.moe import shard_experts

    moe = moe_shape({**TINY, "num_experts": 4})
    assert moe is not None
    state = {"decoder.layers.0.mlp.router.weight": torch.zeros(4, 2)} | {
        f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc2.weight": torch.full((1,), float(e))
        for e in range(4)
    }
    got = shard_experts(state, moe, 2, 1)
    assert sorted(got) == [
        "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight",
        "decoder.layers.0.mlp.router.weight",
    ]
    assert [
        float(got[f"decoder.layers.0.mlp.experts.local_experts.{i}.linear_fc2.weight"]) for i in (0, 1)
    ] == [2.0, 3.0]


def _moe_model(model_dir: str, ep: int, ep_rank: int) -> tuple[Any, Any]:
    """The tiny MoE GPTModel at expert parallel ``ep`` (its groups made), loaded from the HF checkpoint."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from safetensors.torch import load_file

    from rljob_runtime.trainer.megatron import model_shape
    from rljob_runtime.trainer.megatron.convert import hf_to_megatron
    from rljob_runtime.trainer.megatron.model import transformer_config
    from rljob_runtime.trainer.megatron.moe import shard_experts
    from rljob_runtime.trainer.megatron.parallel import Parallelism, padded_vocab_size

    config = json.loads((Path(model_dir) / "config.json").read_text())
    hf = {k: v for f in sorted(Path(model_dir).glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    moe = moe_shape(config)
    assert moe is not None
    shape = model_shape({**config, "architectures": ["Qwen3ForCausalLM"]})
    par = Parallelism(dp=ep)  # megatron-core takes the EP ranks from the data-parallel ones
    tc = transformer_config(
        shape,
        par,
        dtype=torch.float32,
        cpu_init=True,
        overrides=moe_config_fields(moe, expert_parallel=ep, cuda=False),
    )
    padded = padded_vocab_size(shape.vocab_size, 1)
    model = GPTModel(
        config=tc,
        transformer_layer_spec=get_gpt_decoder_block_spec(
            tc, use_transformer_engine=False, normalization="RMSNorm"
        ),
        vocab_size=padded,
        max_sequence_length=shape.max_position_embeddings,
        parallel_output=False,
        share_embeddings_and_output_weights=shape.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=shape.rope_theta,
    )
    state = shard_experts(hf_to_megatron(hf, shape, padded, moe=moe), moe, ep, ep_rank)
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(state)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])
    return model, shape


def _loss_and_grads(model: Any, shape: Any, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    from rljob_runtime.trainer.megatron.model import forward_logits

    logits = forward_logits(model, ids[:, :-1], shape)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
    )
    loss.backward()
    return float(loss), {
        k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None
    }


IDS = torch.randint(0, TINY["vocab_size"], (4, 10), generator=torch.Generator().manual_seed(5))


def _ep_worker(rank: int, port: int, model_dir: str, out: str, ep: int) -> None:
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron_cpu import cpu_megatron_patches

    moe_utils.te_general_gemm = None  # see the logits test
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ep)
    with cpu_megatron_patches():
        ps.initialize_model_parallel(expert_model_parallel_size=ep, create_gloo_process_groups=False)
        model, shape = _moe_model(model_dir, ep, ps.get_expert_model_parallel_rank())
        loss, grads = _loss_and_grads(model, shape, IDS[rank::ep])  # each data-parallel rank its rows
        torch.save(
            {"loss": loss, "grads": grads, "ep_rank": ps.get_expert_model_parallel_rank()},
            Path(out) / f"ep.{rank}",
        )
    dist.destroy_process_group()


@pytest.mark.slow
def test_expert_parallel_2_gives_the_loss_and_grads_of_one_rank(
    tmp_path: Path, cpu_megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EP 2 on two gloo ranks (allgather dispatcher, aux loss off) against EP 1 in this process: the
    summed loss and every gradient equal (dense ones summed over the data-parallel ranks, each expert's
    on the rank that holds it)."""
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from spawned_ranks import spawn_ranks

    from rljob_runtime.trainer.megatron.model import init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    hf_model(tmp_path / "hf", num_experts=4)
    spawn_ranks(_ep_worker, str(tmp_path / "hf"), str(tmp_path), 2)
    init_model_parallel(Parallelism(), 0)
    model, shape = _moe_model(str(tmp_path / "hf"), 1, 0)
    loss, grads = _loss_and_grads(model, shape, IDS)
    ranks = [torch.load(tmp_path / f"ep.{r}", weights_only=False) for r in range(2)]
    assert sum(r["loss"] for r in ranks) == pytest.approx(loss, rel=1e-5)
    for name, grad in grads.items():
        head, sep, rest = name.partition(".experts.local_experts.")
        if sep:  # expert e lives on EP rank e // 2 as its local expert e % 2
            index, tail = rest.split(".", 1)
            r = ranks[int(index) // 2]
            got = r["grads"][f"{head}{sep}{int(index) % 2}.{tail}"]
            # the expert's grad on its rank covers both ranks' tokens (the allgather dispatcher)
        else:
            got = ranks[0]["grads"][name] + ranks[1]["grads"][name]
        assert torch.allclose(got, grad, atol=1e-5, rtol=1e-4), (name, float((got - grad).abs().max()))
