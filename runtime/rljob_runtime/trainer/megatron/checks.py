"""What the megatron backend refuses, checked before Ray starts (``prepare.prepare``) and again by each
rank: options this runtime does not implement yet (the support matrix, ``rljob_api.support``, which
the API server applies at admission with the same words), the model (HF config.json only) and the
layout (which needs config.json, so it stays at run time).

Pure: no megatron-core import, no GPU; reads only the model's config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rljob_api.spec import RLTrainingJobSpec, trainer_gpus
from rljob_api.support import unsupported

from .arch import ModelShape, model_shape
from .megatron_args import check_megatron_args
from .parallel import Parallelism, validate_parallelism


def unsupported_options(spec: RLTrainingJobSpec) -> list[str]:
    """Spec options this runtime does not implement yet ('spec.<field>: <message>', the API server's
    words): the support matrix's verdict, so a rank refuses exactly what admission refuses."""
    return unsupported(spec)


def read_hf_config(model_path: str | Path) -> dict[str, Any]:
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no config.json in {model_path}: the megatron backend needs an HF model directory"
        )
    return dict(json.loads(path.read_text()))


def check_layout(
    spec: RLTrainingJobSpec, hf_config: Any, gpus: int | None = None
) -> tuple[ModelShape, Parallelism]:
    """The model's shape and its layout on ``gpus`` (default: the trainer's GPUs); ValueError naming
    the numbers when the architecture is not supported, the sizes do not divide heads / layers / GPUs
    (or an MoE model's experts, training.parallelism.expert), training.megatronArgs do not parse or fit
    the model (``megatron_args``), training.routingReplay is asked of a dense model, or a global batch
    does not split over the data-parallel ranks."""
    shape = model_shape(hf_config)
    par_spec = spec.training.parallelism
    par = validate_parallelism(
        shape,
        tp=par_spec.tensor,
        pp=par_spec.pipeline,
        cp=par_spec.context,
        ep=par_spec.expert,
        gpus=trainer_gpus(spec) if gpus is None else gpus,
    )
    check_megatron_args(
        spec.training.megatron_args,
        recompute_activations=spec.training.recompute_activations,
        layers_per_stage=shape.num_layers // par.pp,
    )
    if spec.training.routing_replay and shape.moe is None:
        raise ValueError(
            f"training.routingReplay replays the experts SGLang routed each token to: "
            f"{shape.architecture} is dense (no experts); set it false"
        )
    gbs, mbs = spec.training.global_batch_size, spec.training.micro_batch_size
    if spec.training.dynamic_batch.enabled:  # token-budget micro-batches: microBatchSize is ignored
        mbs = 1
        if par.ep > 1:
            # Every MoE layer's token exchange is a collective of the EP ranks, which token budgets
            # would give different numbers of micro-batches: they would wait on each other for ever.
            raise ValueError(
                f"training.dynamicBatch with training.parallelism.expert {par.ep}: the expert-parallel "
                "ranks must run the same number of micro-batches; turn dynamicBatch off"
            )
    if gbs % par.dp or (gbs // par.dp) % mbs:
        raise ValueError(
            f"globalBatchSize {gbs} does not split over {par.dp} data-parallel ranks "
            f"(trainer GPUs {par.world_size} / (tensor {par.tp} x pipeline {par.pp} x context {par.cp})) "
            f"into micro-batches of {mbs}"
        )
    return shape, par


def check_megatron(
    spec: RLTrainingJobSpec, model_path: str | Path, gpus: int | None = None
) -> tuple[ModelShape, Parallelism]:
    """Everything above for a model directory: unsupported options first (all named), then the layout."""
    refused = unsupported_options(spec)
    if refused:
        raise NotImplementedError(" | ".join(refused))
    return check_layout(spec, read_hf_config(model_path), gpus)
