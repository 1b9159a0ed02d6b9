"""Mixture-of-experts models for the megatron backend (Qwen3-MoE; Qwen2-MoE with its gated shared
expert; Mixtral), the pure parts: which layers are MoE, the megatron-core TransformerConfig fields that
route as the HF model does, and the router, expert and shared-expert tensors between HF and Megatron
names (``convert.hf_to_megatron(..., moe=)`` converts a whole MoE checkpoint with them; its logits
equal transformers' at EP 1 on CPU, tests/unit/test_megatron_moe.py and test_megatron_moe_families.py).

Wired in: ``arch.model_shape`` accepts ``MOE_ARCHITECTURES`` (``ModelShape.moe``);
``parallel.validate_parallelism`` checks the expert-parallel size (``training.parallelism.expert``,
through ``checks.check_layout``); ``model.build_gpt_model`` builds the layers through megatron-core's
``get_gpt_decoder_block_spec`` with these fields (SequentialMLP experts); each rank loads its EP block
of experts (``shard_experts``) and the HF export gathers them back under global indices
(``expert_parallel.gather_experts``); the trainer rank trains, checkpoints (torch_dist, resharding
between EP sizes) and exports them. Checked on CPU over gloo at EP 1 and 2
(tests/unit/test_megatron_moe_rank.py); at EP 1 on one GPU, colocated with SGLang and synced into it
(tests/gpu/test_megatron_moe_gpu.py); EP above 1 never on GPUs (the alltoall dispatcher). Admission
(``rljob_api.support``) still refuses ``parallelism.expert`` above 1.

HF (transformers' Qwen3MoeSparseMoeBlock; the per-expert names a checkpoint stores on disk)::

    model.layers.N.mlp.gate.weight                       [E, h]   the router
    model.layers.N.mlp.experts.e.gate_proj.weight        [f, h]
    model.layers.N.mlp.experts.e.up_proj.weight          [f, h]
    model.layers.N.mlp.experts.e.down_proj.weight        [h, f]

Megatron (megatron-core 0.16.1, the local spec's MoELayer with SequentialMLP experts; ``e`` global
here, as in ``convert.py`` the whole model at EP 1)::

    decoder.layers.N.mlp.router.weight                                [E, h]
    decoder.layers.N.mlp.experts.local_experts.e.linear_fc1.weight    [2f, h]  [gate; up]
    decoder.layers.N.mlp.experts.local_experts.e.linear_fc2.weight    [h, f]

Mixtral's checkpoints keep the layer under ``block_sparse_moe.`` with experts' w1 (gate), w3 (up) and
w2 (down) (``MIXTRAL_NAMES``). Qwen2-MoE's adds ``mlp.shared_expert.{gate,up,down}_proj`` and
``mlp.shared_expert_gate.weight`` [1, h], megatron-core's ``mlp.shared_experts.linear_fc1/fc2`` and
``gate_weight`` (output scaled by the sigmoid of the gate, as in HF).

Routing: HF takes the softmax over all experts, then the top k, and renormalises the k weights when
``norm_topk_prob``; megatron-core's ``topk_routing_with_score_function`` does the same with
``use_pre_softmax`` True (softmax, then top k, not renormalised) or False (top k of the logits, then a
softmax over the k: the renormalised weights). Layers: HF makes layer i an MoE layer unless it is in
``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step != 0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
# convert.py's layer prefixes (convert.py imports this module: no import back)
HF_LAYER = "model.layers.{}."
MG_LAYER = "decoder.layers.{}."
MG_EXPERTS = "mlp.experts.local_experts."  # an MoE layer's SequentialMLP experts
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM")


@dataclass(frozen=True)
class HFExpertNames:
    """Where an architecture's checkpoint keeps an MoE layer: the block under ``model.layers.N.`` and
    each expert's gate, up and down projections."""

    block: str = "mlp."
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"


QWEN_NAMES = HFExpertNames()
MIXTRAL_NAMES = HFExpertNames("block_sparse_moe.", "w1", "w3", "w2")


@dataclass(frozen=True)
class MoEShape:
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    norm_topk_prob: bool
    moe_layers: tuple[int, ...]  # the decoder layers whose MLP is the MoE block
    num_layers: int
    aux_loss_coef: float  # router_aux_loss_coef when the config asks for router logits, else 0
    # Qwen2-MoE: one shared expert beside the routed ones, its output scaled by sigmoid(x . gate)
    shared_expert_ffn_hidden_size: int | None = None
    names: HFExpertNames = QWEN_NAMES

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers


def moe_shape(config: Mapping[str, Any]) -> MoEShape | None:
    """The MoE part of an HF config (a dict of config.json), None for a dense model; ValueError naming
    the field when the numbers cannot work. Mixtral (``model_type`` mixtral) keeps its experts under
    ``block_sparse_moe`` as w1/w3/w2, each ``intermediate_size`` wide, and always renormalises the top
    k; Qwen2-MoE adds a gated shared expert (``shared_expert_intermediate_size``)."""
    # The hub's Qwen3-MoE configs say num_experts; transformers 5 writes num_local_experts (an alias).
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    if not experts:
        return None
    mixtral = config.get("model_type") == "mixtral" or "MixtralForCausalLM" in (
        config.get("architectures") or ()
    )
    if float(config.get("router_jitter_noise") or 0.0):
        raise ValueError(
            f"router_jitter_noise {config['router_jitter_noise']} (random noise on the router's logits in "
            "training) is not supported"
        )
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    top_k = int(config.get("num_experts_per_tok", 0))
    if not 0 < top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} must be in 1..num_experts ({experts})")
    step = int(config.get("decoder_sparse_step", 1))
    if step < 1:
        raise ValueError(f"decoder_sparse_step must be at least 1, got {step}")
    dense = {int(i) for i in config.get("mlp_only_layers") or ()}
    layers = tuple(
        i for i in range(int(config["num_hidden_layers"])) if i not in dense and (i + 1) % step == 0
    )
    return MoEShape(
        num_experts=experts,
        top_k=top_k,
        expert_ffn_hidden_size=int(config["intermediate_size" if mixtral else "moe_intermediate_size"]),
        norm_topk_prob=True if mixtral else bool(config.get("norm_topk_prob", False)),
        moe_layers=layers,
        num_layers=int(config["num_hidden_layers"]),
        aux_loss_coef=float(config.get("router_aux_loss_coef", 0.0))
        if config.get("output_router_logits")
        else 0.0,
        shared_expert_ffn_hidden_size=shared or None,
        names=MIXTRAL_NAMES if mixtral else QWEN_NAMES,
    )


def moe_config_fields(moe: MoEShape, *, expert_parallel: int = 1, cuda: bool = True) -> dict[str, Any]:
    """megatron-core TransformerConfig fields for ``moe``: HF's routing (softmax scores; pre-softmax
    exactly when HF does not renormalise the top k; the router's logits in the model's dtype, as HF
    computes them), its aux loss, and the token dispatcher: alltoall on GPUs, allgather without (the
    alltoall one creates CUDA streams; the allgather one needs equal sequence lengths, so it turns
    variable_seq_lengths off). Experts are SequentialMLP (a loop over local experts): grouped GEMM
    needs TransformerEngine or the ``grouped_gemm`` package, neither of which we install. Experts are
    not split by TP (expert tensor parallel size 1, as ``model.init_model_parallel`` makes the groups)."""
    fields: dict[str, Any] = {
        "num_moe_experts": moe.num_experts,
        "moe_router_topk": moe.top_k,
        "moe_ffn_hidden_size": moe.expert_ffn_hidden_size,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not moe.norm_topk_prob,
        "moe_router_topk_scaling_factor": None,
        "moe_router_dtype": None,
        "moe_router_load_balancing_type": "aux_loss" if moe.aux_loss_coef > 0 else "none",
        "moe_aux_loss_coeff": moe.aux_loss_coef,
        "expert_model_parallel_size": expert_parallel,
        "expert_tensor_parallel_size": 1,
        "moe_grouped_gemm": False,
        "moe_token_dispatcher_type": "alltoall" if cuda else "allgather",
        # per layer, 1 for MoE (megatron-core's integer form counts layers differently from HF's step)
        "moe_layer_freq": [int(moe.is_moe(i)) for i in range(moe.num_layers)],
        # Qwen2-MoE's shared expert: megatron-core's SharedExpertMLP with its sigmoid gate [1, h]
        "moe_shared_expert_intermediate_size": moe.shared_expert_ffn_hidden_size,
        "moe_shared_expert_gate": moe.shared_expert_ffn_hidden_size is not None,
    }
    if not cuda:
        fields["variable_seq_lengths"] = False
    return fields


def _experts(layer: int, moe: MoEShape) -> tuple[str, str]:
    return HF_LAYER.format(layer) + moe.names.block, MG_LAYER.format(layer) + "mlp."


def hf_to_megatron_moe(hf: Mapping[str, torch.Tensor], moe: MoEShape, layer: int) -> Tensors:
    """One MoE layer's router, experts (every expert, global indices) and shared expert, HF -> Megatron."""
    src, dst = _experts(layer, moe)
    n = moe.names
    try:
        out = {dst + "router.weight": hf[src + "gate.weight"]}
        for e in range(moe.num_experts):
            expert = f"{src}experts.{e}."
            fc = f"{dst}experts.local_experts.{e}."
            # SwiGLU's fc1 is [gate; up] along the output dim, as for the dense MLP (convert.fuse_gate_up)
            out[fc + "linear_fc1.weight"] = torch.cat(
                [hf[f"{expert}{n.gate}.weight"], hf[f"{expert}{n.up}.weight"]], dim=0
            )
            out[fc + "linear_fc2.weight"] = hf[f"{expert}{n.down}.weight"]
        if moe.shared_expert_ffn_hidden_size is not None:
            shared = src + "shared_expert."
            out[dst + "shared_experts.linear_fc1.weight"] = torch.cat(
                [hf[shared + "gate_proj.weight"], hf[shared + "up_proj.weight"]], dim=0
            )
            out[dst + "shared_experts.linear_fc2.weight"] = hf[shared + "down_proj.weight"]
            out[dst + "shared_experts.gate_weight"] = hf[src + "shared_expert_gate.weight"]  # [1, h] both
    except KeyError as exc:
        raise KeyError(f"missing weight {exc.args[0]!r} of MoE layer {layer}") from None
    return out


def megatron_moe_to_hf(layer: int, suffix: str, tensor: torch.Tensor, moe: MoEShape) -> Tensors | None:
    """One Megatron tensor of MoE layer ``layer`` (``suffix`` after ``decoder.layers.N.``, expert
    indices global) -> its HF tensors; None when ``suffix`` is no router, expert or shared expert."""
    src, _ = _experts(layer, moe)
    n = moe.names
    if suffix == "mlp.router.weight":
        return {src + "gate.weight": tensor}
    if suffix.startswith(MG_EXPERTS):
        index, tail = suffix[len(MG_EXPERTS) :].split(".", 1)
        expert = f"{src}experts.{int(index)}."
        if tail == "linear_fc1.weight":
            gate, up = (t.contiguous() for t in tensor.chunk(2, dim=0))
            return {f"{expert}{n.gate}.weight": gate, f"{expert}{n.up}.weight": up}
        if tail == "linear_fc2.weight":
            return {f"{expert}{n.down}.weight": tensor}
    if suffix == "mlp.shared_experts.linear_fc1.weight":
        gate, up = (t.contiguous() for t in tensor.chunk(2, dim=0))
        return {src + "shared_expert.gate_proj.weight": gate, src + "shared_expert.up_proj.weight": up}
    if suffix == "mlp.shared_experts.linear_fc2.weight":
        return {src + "shared_expert.down_proj.weight": tensor}
    if suffix == "mlp.shared_experts.gate_weight":
        return {src + "shared_expert_gate.weight": tensor}
    return None


def local_experts(num_experts: int, expert_parallel: int, ep_rank: int) -> range:
    """The global indices of the experts EP rank ``ep_rank`` holds (megatron-core: contiguous blocks)."""
    if num_experts % expert_parallel:
        raise ValueError(f"{num_experts} experts do not split over {expert_parallel} expert-parallel ranks")
    per = num_experts // expert_parallel
    return range(ep_rank * per, (ep_rank + 1) * per)


def shard_experts(
    state: Mapping[str, torch.Tensor], moe: MoEShape, expert_parallel: int, ep_rank: int
) -> Tensors:
    """The whole model's Megatron tensors (global expert indices) -> what EP rank ``ep_rank`` holds:
    every non-expert tensor, and its block of experts renumbered from 0 (megatron-core names a rank's
    experts by local index)."""
    mine = local_experts(moe.num_experts, expert_parallel, ep_rank)
    out: Tensors = {}
    for name, tensor in state.items():
        head, sep, rest = name.partition(".experts.local_experts.")
        if not sep:
            out[name] = tensor
            continue
        index, tail = rest.split(".", 1)
        if int(index) in mine:
            out[f"{head}{sep}{int(index) - mine.start}.{tail}"] = tensor
    return out
