"""What a job's spec makes of the megatron model it trains, and the one builder of it: ``model_options``
reads training.fusions (all of ``fusions.FUSIONS`` when unset), training.lmHead (chunked when unset),
recomputeActivations and training.megatronArgs; ``build_policy`` builds this rank's GPTModel chunk with
them under Megatron DDP with the spec's AdamW, the optimizer-state offload and the chunked LM head;
``build_reference`` the frozen reference model. ``MegatronTrainerRank`` (backend.py) and the MFU
benchmark (benchmarks/gpu/megatron_mfu.py) both build through here, so the benchmark's figure is what
a job with those fields gets. Importing it needs no megatron-core (the driver imports the rank class).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_api.spec_training import MEGATRON_FUSIONS

from ..offload import grads, module_tensors
from .arch import ModelShape
from .megatron_args import MegatronOverrides
from .megatron_args import overrides as megatron_overrides
from .optimizer_groups import align_group_index_map
from .parallel import Parallelism


@dataclass(frozen=True)
class ModelOptions:
    """What a job's spec sets in the megatron model it trains: the fusions, the LM head, activation
    recompute and the megatronArgs overrides (``model_options``)."""

    fusions: frozenset[str] = frozenset()
    chunked_head: bool = False
    recompute: Literal["full"] | None = None
    megatron: MegatronOverrides = field(default_factory=MegatronOverrides)
    routing_replay: bool = False  # training.routingReplay: MoE routers built for replay
    sequence_parallel: bool = False  # training.parallelism.sequenceParallel (with tensor parallelism)

    def structure_overrides(self, shape: ModelShape, tp: int) -> dict[str, Any]:
        """TransformerConfig fields the policy and its reference model share: routing replay for an
        MoE model's routers, sequence parallelism over tensor-parallel ranks (megatron-core refuses it
        at tensor parallel 1)."""
        out: dict[str, Any] = {}
        if self.routing_replay and shape.moe is not None:
            out["moe_enable_routing_replay"] = True
        if self.sequence_parallel and tp > 1:
            out["sequence_parallel"] = True
        return out

    def config_overrides(self, shape: ModelShape, tp: int) -> dict[str, Any]:
        """TransformerConfig fields over ``model.transformer_config``'s: megatronArgs and
        ``structure_overrides``."""
        return {**self.megatron.transformer, **self.structure_overrides(shape, tp)}


def model_options(spec: RLTrainingJobSpec, fusions: Iterable[str] | None = None) -> ModelOptions:
    """The spec's ``ModelOptions``: training.fusions (its default when unset), training.lmHead,
    recomputeActivations (full, uniform, 1 layer) and training.megatronArgs. ``fusions`` overrides the
    spec's (tests). Pure: no megatron-core import; ValueError naming a bad megatronArgs value."""
    training = spec.training
    chosen = frozenset(training.megatron_fusions() if fusions is None else fusions)
    if unknown := sorted(chosen - set(MEGATRON_FUSIONS)):
        raise ValueError(f"unknown fusion(s) {unknown}; choose from {list(MEGATRON_FUSIONS)}")
    return ModelOptions(
        fusions=chosen,
        chunked_head=training.chunked_lm_head(),
        recompute="full" if training.recompute_activations else None,
        megatron=megatron_overrides(training.megatron_args),
        routing_replay=training.routing_replay,
        sequence_parallel=training.parallelism.sequence_parallel,
    )


@dataclass
class Policy:
    """What ``build_policy`` builds: the model under Megatron DDP, its optimizer, the optimizer-state
    offload (training.offloadOptimizer) and the chunked head (training.lmHead chunked, on the last
    pipeline stage; None otherwise)."""

    model: Any
    optimizer: Any
    offload: Any = None
    head: Any = None


def _tp_group(par: Parallelism) -> Any:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_group() if par.tp > 1 else None


def build_policy(
    spec: RLTrainingJobSpec,
    options: ModelOptions,
    shape: ModelShape,
    par: Parallelism,
    *,
    dtype: torch.dtype,
    device: torch.device,
    initial: Callable[[torch.nn.Module], None] | None = None,
    distributed_optimizer: bool = True,
    attention: Literal["sdpa", "local"] = "sdpa",
    grad_reduce_in_fp32: bool = True,
    fused_adam: bool | None = None,
) -> Policy:
    """The policy a job trains: this rank's GPTModel chunk built with ``options``, filled by
    ``initial`` (None: left as initialised, as the MFU benchmark's random weights), under Megatron DDP
    (fp32 gradient buffer unless ``grad_reduce_in_fp32`` is False), the spec's AdamW (fused on cuda
    unless ``fused_adam`` says otherwise), training.offloadOptimizer, and the schedule's callbacks on
    the model's config. Megatron's process groups must be up (``model.init_model_parallel``).
    ``attention``, ``grad_reduce_in_fp32`` and ``fused_adam`` are not in the spec: the MFU benchmark's
    comparisons set them; a job keeps the defaults."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from .fusions import use_fused_adam
    from .lm_head import chunked_head, return_hidden_states
    from .model import build_gpt_model

    model = build_gpt_model(
        shape,
        par,
        dtype=dtype,
        recompute=options.recompute,
        attention=attention,
        fusions=options.fusions,
        config_overrides=options.config_overrides(shape, par.tp),
    )
    if initial is not None:  # before the optimizer copies its main params (and DDP its param buffer)
        initial(model)
    if options.chunked_head and model.post_process:
        return_hidden_states(model)
    ddp = options.megatron.ddp_config(
        DistributedDataParallelConfig(
            grad_reduce_in_fp32=grad_reduce_in_fp32,
            overlap_grad_reduce=False,
            use_distributed_optimizer=distributed_optimizer,
        )
    )
    wrapped = DistributedDataParallel(config=model.config, ddp_config=ddp, module=model)
    opt = spec.training.optimizer
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=opt.lr,
            min_lr=opt.min_lr,
            weight_decay=opt.weight_decay,
            adam_beta1=opt.adam_beta1,
            adam_beta2=opt.adam_beta2,
            adam_eps=opt.adam_eps,
            # Megatron reports the grad norm only while clipping: "no clipping" is a huge clip.
            clip_grad=opt.clip_grad if opt.clip_grad > 0 else 1e30,
            bf16=dtype == torch.bfloat16,
            params_dtype=dtype,
            use_distributed_optimizer=distributed_optimizer,
        ),
        [wrapped],
        use_gloo_process_groups=False,  # init_model_parallel creates NCCL groups only
    )
    align_group_index_map(optimizer)  # fp32 norms beside bf16 biases in one group (optimizer_groups.py)
    if fused_adam is None:
        fused_adam = device.type == "cuda"  # fused AdamW has no CPU kernel for every dtype
    if fused_adam:
        # torch's foreach AdamW keeps fp32 temporaries of the whole shard (a 4b's step spikes past
        # an 80 GB GPU) and is slower; fused is the same update in one kernel per dtype group.
        use_fused_adam(optimizer)
    offload = None
    if spec.training.offload_optimizer:
        from .optimizer_offload import OptimizerStateOffload

        # After the fused switch (the update it streams is that one) and before any step.
        offload = OptimizerStateOffload(optimizer).install()
    config = model.config
    config.finalize_model_grads_func = finalize_model_grads  # DP grad all-reduce, tied-embedding sync
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = wrapped.no_sync
    if ddp.overlap_grad_reduce:  # megatronArgs overlap-grad-reduce: as Megatron-LM's training loop
        config.grad_sync_func = wrapped.start_grad_sync
    # After DDP: the head's weight-gradient fusion accumulates into the main_grad DDP gave the weight.
    head = chunked_head(model, _tp_group(par)) if options.chunked_head and model.post_process else None
    return Policy(model=wrapped, optimizer=optimizer, offload=offload, head=head)


def build_reference(
    options: ModelOptions,
    shape: ModelShape,
    par: Parallelism,
    *,
    dtype: torch.dtype,
    initial: Callable[[torch.nn.Module], None],
) -> tuple[Any, Any]:
    """The frozen reference model (KL) with the policy's fusions but wgrad (it has no backward) and its
    LM head: (model, chunked head or None)."""
    from .lm_head import chunked_head, return_hidden_states
    from .model import build_gpt_model

    ref = build_gpt_model(
        shape,
        par,
        dtype=dtype,
        fusions=options.fusions - {"wgrad"},
        config_overrides=options.structure_overrides(shape, par.tp) or None,
    )
    initial(ref)
    ref = ref.eval().requires_grad_(False)
    if not (options.chunked_head and ref.post_process):
        return ref, None
    return_hidden_states(ref)
    return ref, chunked_head(ref, _tp_group(par))


def ddp_weight_tensors(model: Any) -> list[torch.Tensor]:
    """What a model under Megatron DDP holds as weights: the module's parameters and buffers and DDP's
    param buffers (DDP's own ``buffers`` attribute is that list: it shadows ``Module.buffers``, so the
    module's tensors are read from ``model.module``); for the colocated turns' offload groups."""
    buffers = [*model.buffers, *model.expert_parallel_buffers]
    return [*module_tensors(model.module), *(b.param_data for b in buffers)]


def ddp_grad_tensors(model: Any) -> list[torch.Tensor | None]:
    """Its gradients: DDP's fp32 grad buffers and the parameters' grad / main_grad views."""
    buffers = [*model.buffers, *model.expert_parallel_buffers]
    return [*(b.grad_data for b in buffers), *grads(model.module)]
