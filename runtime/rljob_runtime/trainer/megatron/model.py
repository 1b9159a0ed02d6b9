"""Megatron-core GPTModel from an HF config (local layer spec: no TransformerEngine; core attention
through torch's SDPA by default, see attention.py), HF weights in and out. Needs megatron-core
(``pip install 'rljob[megatron]'``) and an initialised torch.distributed.

Call order on every rank: ``validate_parallelism`` (pure, before any GPU work) -> ``init_model_parallel``
-> ``build_gpt_model`` -> ``load_hf_weights``; ``export_hf_weights`` gives the HF tensors back.

MoE models (Qwen3-MoE, ``ModelShape.moe``): the layers come from megatron-core's
``get_gpt_decoder_block_spec`` (dense and MoE layers by ``moe_layer_freq``), the experts are
SequentialMLP (one MLP per local expert: grouped GEMM needs TransformerEngine or the ``grouped_gemm``
package, neither installed), split over the expert-parallel ranks (``moe.shard_experts``) and gathered
back for the export (``expert_parallel.gather_experts``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig

from .arch import ModelShape, model_shape
from .attention import SdpaAttention
from .convert import Tensors, hf_to_megatron, megatron_to_hf
from .expert_parallel import gather_experts, is_expert, mark_experts
from .fusions import FusedRMSNorm, check_fusions, install_rope_fusion, install_wgrad_fusion
from .moe import moe_config_fields, shard_experts
from .norms import RMSNorm
from .parallel import Parallelism, padded_vocab_size, validate_parallelism
from .rope import inv_freq as rope_inv_freq
from .shard import from_stage, gather_tensor, shard_tp, to_stage

Recompute = Literal["full", "selective"] | None
# "sdpa": SdpaAttention (flash / cuDNN kernels on GPU, no s x s scores); "local": megatron-core's
# DotProductAttention (materialised scores, fp32 softmax), the reference it is tested against.
Attention = Literal["sdpa", "local"]


def init_model_parallel(par: Parallelism, seed: int = 0) -> None:
    """Megatron's process groups for ``par`` (torch.distributed must be up with par.world_size ranks)."""
    if not dist.is_initialized():
        raise RuntimeError("init_model_parallel: torch.distributed is not initialised")
    if dist.get_world_size() != par.world_size:
        raise ValueError(f"{dist.get_world_size()} ranks for a layout of {par.world_size} GPUs ({par})")
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp,
        # Experts whole on each rank (no expert TP), ep of them from each stage's data-parallel ranks.
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=1,
        create_gloo_process_groups=False,
    )
    if torch.cuda.is_available():  # the TP-aware RNG streams used by dropout and init
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(
    shape: ModelShape,
    par: Parallelism,
    *,
    dtype: torch.dtype = torch.bfloat16,
    recompute: Recompute = None,
    cpu_init: bool = False,
    fusions: Iterable[str] = (),
    recompute_layers: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TransformerConfig:
    """Llama-style decoder settings: RMSNorm, SwiGLU without biases (qkv bias for Qwen2), GQA, qk-norm
    for Qwen3, no dropout (RL fine-tuning; HF configs carry 0).

    ``fusions`` (``fusions.FUSIONS``; megatron-core 0.16.1 without apex/TE, all torch.compile'd or
    plain torch, so meant for GPU: a first compile on CPU takes seconds to tens of seconds): the config
    carries two of them, "swiglu" (megatron-core's ``fusions/fused_bias_swiglu.py``) and "wgrad"
    (gradient-accumulation fusion through ``fusions.WGRAD``, installed here in place of apex's
    extension); "norm" and "rope" are the layer spec's and the RoPE function's (``build_gpt_model``).
    The other megatron-core fusion flags stay off: they need apex, TE or megatron's own CUDA
    extensions, or have nothing to fuse here (see the comments at each flag).

    ``recompute_layers`` (with ``recompute="full"`` only): recompute the first N layers of each pipeline
    stage and keep the others' activations (Megatron's "block" method), for a memory budget between no
    recompute and all layers (None: every layer, "uniform" one at a time).

    ``overrides``: TransformerConfig fields set over the above (training.megatronArgs, parsed by
    ``megatron_args.overrides``), passed to the constructor so its ``__post_init__`` checks them.

    An MoE ``shape`` adds ``moe.moe_config_fields``: HF's routing, the token dispatcher of this rank's
    device (alltoall with CUDA, allgather without) and SequentialMLP experts over ``par.ep`` ranks.
    """
    if recompute_layers is not None:
        per_stage = shape.num_layers // par.pp
        if recompute != "full":
            raise ValueError(f"recompute_layers needs recompute='full', got {recompute!r}")
        if not 0 < recompute_layers <= per_stage:
            raise ValueError(
                f"recompute_layers must be in 1..{per_stage} (layers per pipeline stage), got {recompute_layers}"
            )
    fusions = check_fusions(fusions)
    if "wgrad" in fusions:
        install_wgrad_fusion()  # before any ColumnParallelLinear checks for apex's extension
    fields: dict[str, Any] = dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,  # read by the "local" attention only (SDPA kernels use fp32)
        # mlp.py: with F.silu + gated_linear_unit this calls bias_swiglu_impl -> SwiGLUFunction, whose
        # forward/backward are megatron.core.jit.jit_fuser = torch.compile (torch >= 2.2): one kernel
        # each way, and it saves only the fc1 output for backward (the unfused glu also keeps silu(x)
        # and x_linear + glu_linear_offset: two more [tokens, ffn] tensors per layer).
        bias_activation_fusion="swiglu" in fusions,
        # FusedScaleMaskSoftmax imports megatron's scaled_masked_softmax_cuda extension (not shipped
        # in the wheel); moot with SDPA, which has its own softmax.
        masked_softmax_fusion=False,
        # rope_utils takes the fused kernel from TE only; TransformerConfig refuses it without TE. The
        # "rope" fusion compiles the unfused path instead (fusions.install_rope_fusion).
        apply_rope_fusion=False,
        # No linear biases and dropout 0 (F.dropout with p=0 returns its input): only the residual
        # add is left, nothing worth a compiled kernel.
        bias_dropout_fusion=False,
        # Apex's fused_weight_gradient_mlp_cuda, or fusions.WGRAD (installed above): each linear's
        # backward GEMM accumulates its weight grad into DDP's fp32 main_grad. Backward then needs
        # Megatron DDP (main_grad); tied embeddings stay right through LanguageModule's zero_out_wgrad.
        gradient_accumulation_fusion="wgrad" in fusions,
        # Apex's persistent LayerNorm kernel; the local spec's torch norms (WrappedTorchNorm) and
        # FusedRMSNorm refuse it, as they do memory_efficient_layer_norm (left at its default, off).
        persist_layer_norm=False,
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp,
        # On with training.parallelism.sequenceParallel (``overrides``): the norms are then ours, which
        # mark their weights for it (``norm_for``); megatron-core's torch norms refuse it.
        sequence_parallel=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        pipeline_dtype=dtype,
        variable_seq_lengths=True,  # RL batches differ in length from step to step
        moe_token_dispatcher_type="alltoall",  # the default (allgather) refuses variable lengths, even dense
        recompute_granularity=recompute,
        recompute_method=None if recompute != "full" else "uniform" if recompute_layers is None else "block",
        recompute_num_layers=None if recompute != "full" else recompute_layers or 1,
        use_cpu_initialization=cpu_init,
        # Weights come from an HF checkpoint, but keep Megatron's init: it is also what marks TP-split
        # parameters (tensor_model_parallel); without it the grad norm skips TP ranks > 0's shards.
        perform_initialization=True,
    )
    if shape.moe is not None:
        fields.update(moe_config_fields(shape.moe, expert_parallel=par.ep, cuda=torch.cuda.is_available()))
    return TransformerConfig(**{**fields, **(overrides or {})})


def norm_for(fusions: Iterable[str], sequence_parallel: bool = False) -> type:
    """The norm of every slot: ``FusedRMSNorm`` with the "norm" fusion; else, under sequence
    parallelism, ``norms.RMSNorm`` (the same computation as megatron-core's ``WrappedTorchNorm``, which
    refuses it); else ``WrappedTorchNorm`` itself."""
    if "norm" in check_fusions(fusions):
        return FusedRMSNorm
    return RMSNorm if sequence_parallel else WrappedTorchNorm


def layer_spec(
    shape: ModelShape,
    attention: Attention = "sdpa",
    fusions: Iterable[str] = (),
    sequence_parallel: bool = False,
) -> ModuleSpec:
    """megatron-core's local layer spec (torch norms, Megatron's parallel linears), with SdpaAttention
    as the core attention for "sdpa" ("local" keeps DotProductAttention) and ``norm_for``'s norm in
    every norm slot of the layer (input, pre-MLP, q and k)."""
    spec = get_gpt_layer_local_spec(qk_layernorm=shape.qk_norm, normalization="RMSNorm")
    return _our_layer(spec, attention, norm_for(fusions, sequence_parallel))


def _our_layer(spec: ModuleSpec, attention: Attention, norm: type) -> ModuleSpec:
    """``spec`` (a local-spec layer, dense or MoE) with ``layer_spec``'s attention and norms."""
    if attention not in ("sdpa", "local"):
        raise ValueError(f"attention must be 'sdpa' or 'local', got {attention!r}")
    if attention == "local" and norm is WrappedTorchNorm:
        return spec
    spec = copy.deepcopy(spec)  # a copy: the spec's objects stay as megatron-core built them
    layer: Any = spec.submodules  # TransformerLayerSubmodules (ModuleSpec types it as object)
    if attention == "sdpa":
        layer.self_attention.submodules.core_attention = SdpaAttention
    if norm is not WrappedTorchNorm:
        attn = layer.self_attention.submodules
        slots = [(layer, "input_layernorm"), (layer, "pre_mlp_layernorm")]
        slots += [(attn, "q_layernorm"), (attn, "k_layernorm")]
        for owner, name in slots:
            if getattr(owner, name) is WrappedTorchNorm:  # q/k are IdentityOp without qk-norm
                setattr(owner, name, norm)
    return spec


def moe_decoder_spec(
    config: TransformerConfig, attention: Attention = "sdpa", fusions: Iterable[str] = ()
) -> TransformerBlockSubmodules:
    """An MoE model's ``transformer_layer_spec``: megatron-core's block spec of this stage's layers
    (dense or MoE by the config's ``moe_layer_freq``; local modules, SequentialMLP experts), each with
    ``layer_spec``'s attention and norms, and ``norm_for``'s norm as the final norm."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    norm = norm_for(fusions, config.sequence_parallel)
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    return TransformerBlockSubmodules(
        layer_specs=[_our_layer(spec, attention, norm) for spec in block.layer_specs],
        layer_norm=block.layer_norm if norm is WrappedTorchNorm else norm,
    )


def allow_moe_without_te() -> None:
    """megatron-core 0.16.1 names ``moe_utils.te_general_gemm`` only when TransformerEngine imports, and
    the router's gating function reads it: NameError without TE (on GPUs too). None selects its
    plain-torch matmul. Process-wide and idempotent; a real TE binding is left alone."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def decoder_spec(config: TransformerConfig, layer: ModuleSpec, fusions: Iterable[str] = ()) -> Any:
    """What GPTModel takes as ``transformer_layer_spec``: the layer spec itself (TransformerBlock then
    adds megatron-core's default final norm, WrappedTorchNorm without TE/apex), or, where ``norm_for``
    picks another norm, this stage's layers and that norm as the final norm, which a layer spec cannot
    name."""
    norm = norm_for(fusions, config.sequence_parallel)
    if norm is WrappedTorchNorm:
        return layer
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config), layer_norm=norm)


def build_gpt_model(
    shape: ModelShape,
    par: Parallelism,
    *,
    dtype: torch.dtype = torch.bfloat16,
    recompute: Recompute = None,
    parallel_output: bool = False,
    attention: Attention = "sdpa",
    fusions: Iterable[str] = (),
    recompute_layers: int | None = None,
    config_overrides: Mapping[str, Any] | None = None,
) -> GPTModel:
    """This rank's GPTModel chunk (its TP slice and PP stage), uninitialised, on the current device.

    ``parallel_output``: keep the logits split over TP ranks by vocab; False gathers them.
    ``attention``: the core attention (``Attention``). ``fusions``: names from ``fusions.FUSIONS``
    (see ``transformer_config``); none by default here: a job's come from training.fusions (all four
    unless it says otherwise, ``policy.model_options``), compiled on each rank's first steps. "rope"
    patches megatron-core's RoPE for the whole process (every model built after it too). ``recompute_layers``:
    see ``transformer_config``; ``config_overrides``: its ``overrides`` (megatronArgs).
    """
    fusions = check_fusions(fusions)
    cpu = not torch.cuda.is_available()
    config = transformer_config(
        shape,
        par,
        dtype=dtype,
        recompute=recompute,
        cpu_init=cpu,
        fusions=fusions,
        recompute_layers=recompute_layers,
        overrides=config_overrides,
    )
    if "rope" in fusions:
        install_rope_fusion()
    if shape.moe is not None:
        allow_moe_without_te()
        spec: Any = moe_decoder_spec(config, attention, fusions)
    else:
        spec = decoder_spec(config, layer_spec(shape, attention, fusions, config.sequence_parallel), fusions)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size(shape.vocab_size, par.tp),
        max_sequence_length=shape.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=shape.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=shape.rope_theta,  # megatron-core annotates an int; it is used as a float
    )
    if shape.rope_scaling is not None:
        set_rope_frequencies(model, shape)
    if shape.moe is not None:
        mark_experts(model)  # the same optimizers and checkpoint at every EP size
    return model if cpu else model.cuda(torch.cuda.current_device())


def set_rope_frequencies(model: GPTModel, shape: ModelShape) -> None:
    """Scaled RoPE (``shape.rope_scaling``) with transformers' frequencies (``rope.inv_freq``): GPTModel's
    own ``rope_scaling`` hard-codes Llama 3.1's band limits. Before the first forward: RotaryEmbedding
    caches its embedding per sequence length (lru_cache) from ``inv_freq``, a plain attribute."""
    rotary = model.rotary_pos_emb
    rotary.inv_freq = rope_inv_freq(shape, device=rotary.inv_freq.device)


def setup_model(
    hf_config: Any,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    gpus: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    recompute: Recompute = None,
    seed: int = 0,
    parallel_output: bool = False,
    attention: Attention = "sdpa",
    fusions: Iterable[str] = (),
) -> tuple[GPTModel, ModelShape, Parallelism]:
    """Validate the layout (pure: a bad one is refused before any process group or GPU memory), then
    create Megatron's process groups and this rank's model chunk. ``gpus`` defaults to the world size."""
    shape = model_shape(hf_config)
    if gpus is None:
        gpus = dist.get_world_size() if dist.is_initialized() else 1
    par = validate_parallelism(shape, tp=tp, pp=pp, cp=cp, gpus=gpus)
    init_model_parallel(par, seed)
    model = build_gpt_model(
        shape,
        par,
        dtype=dtype,
        recompute=recompute,
        parallel_output=parallel_output,
        attention=attention,
        fusions=fusions,
    )
    return model, shape, par


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while isinstance(inner := getattr(model, "module", None), torch.nn.Module):
        model = inner
    return model


def rank_state(hf: Mapping[str, torch.Tensor], shape: ModelShape, par: Parallelism) -> Tensors:
    """The Megatron tensors this rank holds (its PP stage, its TP slice, its EP rank's experts under
    their local indices) from an HF state dict."""
    whole = hf_to_megatron(hf, shape, padded_vocab_size(shape.vocab_size, par.tp), moe=shape.moe)
    if shape.moe is not None:
        whole = shard_experts(whole, shape.moe, par.ep, ps.get_expert_model_parallel_rank())
    stage = to_stage(whole, shape, par.pp, ps.get_pipeline_model_parallel_rank())
    return shard_tp(stage, par.tp, ps.get_tensor_model_parallel_rank())


@torch.no_grad()
def load_hf_weights(
    model: torch.nn.Module, hf: Mapping[str, torch.Tensor], shape: ModelShape, par: Parallelism
) -> None:
    """Copy HF weights into this rank's chunk (cast to its dtype); every parameter must be covered."""
    params = dict(unwrap(model).named_parameters())
    state = rank_state(hf, shape, par)
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise ValueError(f"HF -> Megatron names disagree: not converted {missing[:5]}, unknown {extra[:5]}")
    for name, param in params.items():
        src = state[name]
        if tuple(src.shape) != tuple(param.shape):
            raise ValueError(
                f"{name}: converted shape {tuple(src.shape)} != model shape {tuple(param.shape)}"
            )
        param.copy_(src.to(device=param.device, dtype=param.dtype))


@torch.no_grad()
def export_hf_weights(model: torch.nn.Module, shape: ModelShape, par: Parallelism) -> Tensors:
    """HF tensors of this rank's PP stage, whole (gathered over TP), on this rank's device; an MoE
    model's experts gathered over its expert-parallel group, each once under its global index.

    Every TP (and EP) rank gets the same result; stages hold different layers (global HF names), so a
    caller with pp > 1 merges the stages' dicts. A collective of the TP and the EP group.
    """
    group = ps.get_tensor_model_parallel_group()
    stage: Tensors = {}
    params = list(unwrap(model).named_parameters())
    for name, param in params:
        tensor = param.detach()
        if is_expert(name):  # never TP-split (expert tensor parallel size 1): gathered over EP below
            continue
        if par.tp > 1:
            parts = [torch.empty_like(tensor) for _ in range(par.tp)]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            tensor = gather_tensor(name, parts)
        stage[name] = tensor
    if shape.moe is not None:
        experts = {name: param.detach() for name, param in params if is_expert(name)}
        stage.update(gather_experts(experts, shape.moe, par.ep))
    pp_rank = ps.get_pipeline_model_parallel_rank()
    return megatron_to_hf(from_stage(stage, shape, par.pp, pp_rank), shape)


def causal_mask(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """[1, 1, s, s] bool, True where attention is masked (Megatron's convention)."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]


def forward_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, shape: ModelShape, **kwargs: Any
) -> torch.Tensor:
    """[b, s] token ids -> [b, s, vocab] logits (padding columns stripped) of a pp = 1 model built with
    ``parallel_output=False``. Right-padded batches need no padding mask: real tokens come first."""
    b, s = input_ids.shape
    position_ids = torch.arange(s, device=input_ids.device)[None].expand(b, s)
    logits = model(input_ids, position_ids, causal_mask(s, input_ids.device), **kwargs)
    return logits[..., : shape.vocab_size]
