"""Weights through a Hugging Face directory (``/update_weights_from_disk``): trainer rank 0 writes its
weights as safetensors into a scratch directory on its own node, and the engines, on that same node,
load them from there. The fastest way on CPU (no encoding, one copy each way, nothing through the
driver, which may run on another node: the Ray head) and the fallback of the GPU transports. The
directory holds the last sync, so a relaunched engine loads it again.

The scratch directory is in ``/dev/shm`` where that has room for the weights twice over, else in
the temp directory (a pod's own ``/dev/shm`` is 64 MiB unless a memory volume is mounted there).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .. import engine_api
from .base import EngineUpdateLike, Metrics, RolloutSide, WeightSender, WeightTransport, nbytes, timed

if TYPE_CHECKING:
    import torch

# Besides the weights, what an engine's loader reads from the directory (SGLang's disk update
# iterates *.safetensors; config files keep the directory a loadable model for a relaunch).
SIDE_FILES = ("config.json", "generation_config.json")
WEIGHTS_FILE = "model.safetensors"
SHM = "/dev/shm"
# How long close waits for the trainer to remove the directory: a rank stuck in a collective must not
# hold up the run's shutdown.
REMOVE_TIMEOUT_S = 60.0

log = logging.getLogger(__name__)


def scratch_root(needed_bytes: int, shm: str = SHM) -> str | None:
    """``shm`` when it has room for ``needed_bytes`` twice over (the new file beside the old one),
    else None (the temp directory)."""
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    return shm if stats.f_bavail * stats.f_frsize >= 2 * needed_bytes else None


def write_weights_dir(
    named: Mapping[str, torch.Tensor], directory: str | None, model_path: str | None
) -> tuple[str, int]:
    """Write ``named`` as one safetensors file into ``directory`` (a new scratch directory when None),
    with the model's config files beside it; returns (directory, bytes). The file is written under a
    temporary name and renamed, so a reader never sees half of it."""
    from safetensors.torch import save_file

    size = nbytes(named)
    if directory is None:
        directory = tempfile.mkdtemp(prefix="rljob-weights-", dir=scratch_root(size))
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)  # a restarted trainer on the same node reuses it
    if model_path:
        for name in SIDE_FILES:
            source = Path(model_path) / name
            if source.is_file() and not (target / name).exists():
                shutil.copy2(source, target / name)
    partial = target / f".{WEIGHTS_FILE}.partial"
    save_file({k: v.contiguous() for k, v in named.items()}, str(partial))
    partial.replace(target / WEIGHTS_FILE)
    return str(target), size


class DiskTransport(WeightTransport):
    name = "disk"

    def __init__(self, model_path: str | None = None) -> None:
        self.model_path = model_path
        self._directory: str | None = None  # on the trainer's node, chosen by its first write
        self._writer: WeightSender | None = None  # the trainer that can remove it

    def _transfer(self, trainer: WeightSender, rollout: RolloutSide, update: EngineUpdateLike) -> Metrics:
        metrics: Metrics = {}
        with timed(metrics, "time/sync_export"):
            self._directory, size = trainer.write_weights(self._directory, self.model_path)
        self._writer = trainer
        update.post("/update_weights_from_disk", engine_api.update_weights_from_disk_body(self._directory))
        metrics["sync/bytes"] = float(size)
        return metrics

    def refresh(self, trainer: WeightSender, rollout: RolloutSide, url: str) -> None:
        if self._directory is None:  # nothing written yet: export now
            super().refresh(trainer, rollout, url)
            return
        with rollout.updating(only=url) as update:  # the directory holds the current version
            update.post(
                "/update_weights_from_disk", engine_api.update_weights_from_disk_body(self._directory)
            )

    def close(self, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
        directory, writer = self._directory, self._writer
        self._directory = self._writer = None
        if directory is None or writer is None:
            return
        removed = threading.Event()

        def remove() -> None:
            try:
                writer.remove_weights(directory)
                removed.set()
            except Exception:  # the trainer may be gone (its node's scratch goes with its pod)
                pass

        # A daemon thread: a trainer that never answers leaves it behind, not the process.
        worker = threading.Thread(target=remove, name="remove-weights", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if not removed.is_set():
            if worker.is_alive():
                log.warning("the trainer did not remove %s in %.0f s; removing it here", directory, timeout_s)
            shutil.rmtree(directory, ignore_errors=True)  # on one node, the driver can remove it itself
