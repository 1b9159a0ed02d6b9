"""Weights through a Hugging Face directory (``/update_weights_from_disk``): the trainer's export as
safetensors in a scratch directory every engine can read (``/dev/shm`` when everything runs on one
node), the fallback of the GPU transports and the fastest way on one CPU node (no encoding, one copy
each way). The directory holds the last sync, so a relaunched engine loads it again."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .. import engine_api
from .base import (
    EngineUpdateLike,
    Metrics,
    NamedWeights,
    RolloutSide,
    WeightSender,
    WeightTransport,
    nbytes,
    timed,
)

# Besides the weights, what an engine's loader reads from the directory (SGLang's disk update
# iterates *.safetensors; config files keep the directory a loadable model for a relaunch).
SIDE_FILES = ("config.json", "generation_config.json")


class DiskTransport(WeightTransport):
    name = "disk"

    def __init__(self, model_path: str | None = None, root: str | None = None) -> None:
        self.model_path = model_path
        self.root = root if root is not None else ("/dev/shm" if Path("/dev/shm").is_dir() else None)
        self._scratch: Path | None = None
        self._written = False

    def _dir(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="rljob-weights-", dir=self.root))
            if self.model_path:
                for name in SIDE_FILES:
                    source = Path(self.model_path) / name
                    if source.is_file():
                        shutil.copy2(source, self._scratch / name)
        return self._scratch

    def _transfer(self, trainer: NamedWeights, rollout: RolloutSide, update: EngineUpdateLike) -> Metrics:
        metrics: Metrics = {}
        with timed(metrics, "time/sync_export"):
            from safetensors.torch import save_file

            named = trainer.named_tensors()
            save_file({k: v.contiguous() for k, v in named.items()}, str(self._dir() / "model.safetensors"))
        self._written = True
        update.post("/update_weights_from_disk", engine_api.update_weights_from_disk_body(str(self._dir())))
        metrics["sync/bytes"] = float(nbytes(named))
        return metrics

    def refresh(self, trainer: WeightSender, rollout: RolloutSide, url: str) -> None:
        if not self._written:  # nothing on disk yet: export now
            super().refresh(trainer, rollout, url)
            return
        with rollout.updating(only=url) as update:  # the directory holds the current version
            update.post(
                "/update_weights_from_disk", engine_api.update_weights_from_disk_body(str(self._dir()))
            )

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
            self._written = False
