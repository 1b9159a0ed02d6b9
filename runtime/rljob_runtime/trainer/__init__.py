"""Trainer backends: ``torch`` (transformers + torch.distributed data parallel, CPU-capable) here;
``megatron`` implements the same ``base.TrainerBackend`` interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from ..placement import Slot
    from .base import TrainerBackend


def create_trainer(spec: RLTrainingJobSpec, model_path: str, slots: Sequence[Slot]) -> TrainerBackend:
    """Start the spec's trainer backend on the given slots."""
    if spec.training.backend == "torch":
        from .group import TrainerGroup

        return TrainerGroup.create(spec, model_path, slots)
    raise NotImplementedError(f"training.backend {spec.training.backend!r} is not available in this build")
