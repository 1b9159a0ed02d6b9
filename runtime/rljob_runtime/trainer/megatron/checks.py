"""What the megatron backend refuses, checked before Ray starts (``driver.prepare``) and again by each
rank: options it does not implement yet (by name), the model (HF config.json only) and the layout.

Pure: no megatron-core import, no GPU; reads only the model's config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rljob_api.spec import RLTrainingJobSpec, trainer_gpus

from .arch import ModelShape, model_shape
from .parallel import Parallelism, validate_parallelism


def unsupported_options(spec: RLTrainingJobSpec) -> list[str]:
    """Spec options the megatron backend does not implement yet, each named as in the manifest."""
    training, par = spec.training, spec.training.parallelism
    out = []
    if spec.algorithm.advantage_estimator == "ppo":
        out.append("advantageEstimator ppo with training.backend megatron (no critic yet; use backend torch)")
    if training.dynamic_batch.enabled:
        out.append("training.dynamicBatch with training.backend megatron")
    if par.expert != 1:
        out.append(f"training.parallelism.expert {par.expert} (MoE needs TransformerEngine)")
    if par.sequence_parallel:
        out.append("training.parallelism.sequenceParallel (needs TransformerEngine norms)")
    if training.megatron_args:
        out.append(f"training.megatronArgs ({', '.join(sorted(training.megatron_args))})")
    if spec.model.megatron_checkpoint:
        out.append("model.megatronCheckpoint (start from the Hugging Face weights)")
    return out


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
    the numbers when the architecture is not supported, the sizes do not divide heads / layers / GPUs,
    or a global batch does not split over the data-parallel ranks."""
    shape = model_shape(hf_config)
    par_spec = spec.training.parallelism
    par = validate_parallelism(
        shape,
        tp=par_spec.tensor,
        pp=par_spec.pipeline,
        cp=par_spec.context,
        gpus=trainer_gpus(spec) if gpus is None else gpus,
    )
    gbs, mbs = spec.training.global_batch_size, spec.training.micro_batch_size
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
    unsupported = unsupported_options(spec)
    if unsupported:
        raise NotImplementedError("not supported by the megatron backend yet: " + "; ".join(unsupported))
    return check_layout(spec, read_hf_config(model_path), gpus)
