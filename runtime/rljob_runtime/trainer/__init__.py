"""Trainer backends: ``torch`` (transformers + torch.distributed data parallel, CPU-capable) and
``megatron`` (Megatron-core, GPU: ``trainer/megatron/``), both behind ``base.TrainerBackend`` as a
``group.TrainerGroup`` of Ray actors, one rank per trainer slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from ..placement import Slot
    from .group import TrainerGroup


def create_trainer(spec: RLTrainingJobSpec, model_path: str, slots: Sequence[Slot]) -> TrainerGroup:
    """Start the spec's trainer backend (training.backend) on the given slots."""
    from .group import TrainerGroup

    return TrainerGroup.create(spec, model_path, slots)
