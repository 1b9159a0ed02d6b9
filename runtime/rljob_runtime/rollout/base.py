"""The rollout side as the driver sees it: ``Rollout``, what ``manager.RolloutManager`` offers the
driver loop, its step rollouts (``step_rollout``), the colocated turns (``colocation.Turns``) and the
weight transports (``sync.base.RolloutSide``)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..sync.base import RolloutSide

if TYPE_CHECKING:
    from ..data.sample import Sample
    from .engines import Refresher


class Rollout(RolloutSide, Protocol):
    """Engines behind a router, generating samples and taking weight updates (``RolloutSide``)."""

    # Brings a relaunched engine to the current weights (the driver's transport sets it).
    refresher: Refresher | None

    def generate(self, samples: Sequence[Sample], **sampling_overrides: Any) -> list[Sample]:
        """Fill every sample's response in place; ``sampling_overrides`` change rollout's sampling."""
        ...

    def generate_async(
        self, samples: Sequence[Sample], **sampling_overrides: Any
    ) -> concurrent.futures.Future[list[Sample]]:
        """``generate`` in flight (async training overlaps the next rollout)."""
        ...

    def abort(self) -> None:
        """Abort every request in flight (dynamic sampling has enough groups)."""
        ...

    def set_weight_version(self, version: int | str) -> None:
        """Label the engines' current weights (a resumed run's engines loaded its checkpoint)."""
        ...

    def release_memory(self) -> None:
        """Colocated engines free their GPU memory for the trainer's turn."""
        ...

    def resume_memory(self, tags: Sequence[str] | None = None) -> None: ...

    def engine_gpu_memory_gb(self) -> list[float]:
        """GPU memory each engine's server holds (GB; -1 where NVML cannot tell)."""
        ...

    def shutdown(self) -> None: ...
