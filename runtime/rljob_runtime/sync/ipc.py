"""Colocated weight sync by CUDA IPC (``/update_weights_from_tensor``, ``load_format:
"flattened_bucket"``), SGLang's own path for engines that share the trainer's GPUs.

Trainer rank 0 exports the weights once (HF names, whole), plans buckets, then shares them one at a
time (``cuda_ipc.IpcProducer``): bucket i+1 is flattened while the engines load bucket i, and bucket
i is freed once they answered, so at most two buckets of GPU memory exist, whatever the model size.
Each request carries one bucket, once per TP rank of the engine (every rank opens rank 0's handle).
"""

from __future__ import annotations

from typing import Any

from .. import engine_api
from .base import EngineUpdateLike, IpcSender, Metrics, RolloutSide, WeightTransport, timed
from .cuda_ipc import IPC_BUCKET_BYTES, Codec


class IpcTransport(WeightTransport):
    name = "cuda_ipc"

    def __init__(self, codec: Codec, cast: str | None = None, bucket_bytes: int = IPC_BUCKET_BYTES) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.codec, self.cast, self.bucket_bytes = codec, cast, bucket_bytes

    def _transfer(self, trainer: IpcSender, rollout: RolloutSide, update: EngineUpdateLike) -> Metrics:
        metrics: Metrics = {}
        with timed(metrics, "time/sync_export"):
            count, size = trainer.begin_ipc(self.bucket_bytes, self.codec, self.cast)
        try:
            pending = trainer.ipc_bucket_async(0) if count else None
            for index in range(count):
                with timed(metrics, "time/sync_share"):  # what the engines wait for beyond their loads
                    payload = trainer.get(pending)
                pending = trainer.ipc_bucket_async(index + 1) if index + 1 < count else None

                def body(url: str, p: Any = payload) -> dict[str, Any]:  # one copy per TP rank
                    return engine_api.update_weights_from_tensor_body(
                        [p] * update.tp_sizes[url], load_format="flattened_bucket"
                    )

                with timed(metrics, "time/sync_load"):
                    update.post("/update_weights_from_tensor", body)
        finally:
            trainer.end_ipc()
        metrics.update({"sync/bytes": float(size), "sync/buckets": float(count)})
        return metrics
