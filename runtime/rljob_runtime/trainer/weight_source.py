"""The trainer's side of GPU weight sync, shared by both backends: CUDA IPC buckets (colocated,
``sync/cuda_ipc.py``) and NCCL broadcast (disaggregated, ``sync/nccl.py``).

A backend rank mixes this in and provides ``device_weights()``: its policy under HF names on its own
device, whole, on the rank that sends (global rank 0) and ``{}`` elsewhere. For megatron that is a
collective of data-parallel rank 0's TP x PP ranks (TP gather, PP merge), so the group calls these
methods on all of them. Only global rank 0 shares buckets or joins the weight-update group.
"""

from __future__ import annotations

from typing import Any

import torch

from ..net import free_port, node_ip
from ..sync.nccl import BucketSpec, NcclSender, WeightUpdateGroup, bucket_specs


class WeightSource:
    rank: int
    _update_group: WeightUpdateGroup | None = None

    def device_weights(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def weight_group_address(self) -> tuple[str, int]:
        """Where this rank (global 0) will host the group's store: its node IP and a free port."""
        return node_ip(), free_port()

    def init_weight_update_group(
        self, address: str, port: int, world_size: int, group_name: str, backend: str = "nccl"
    ) -> None:
        """Host the group as rank 0; returns once every engine joined (they are asked concurrently)."""
        self.close_weight_update_group()
        self._update_group = WeightUpdateGroup(address, port, 0, world_size, group_name, backend=backend)

    def weight_bucket_specs(self, max_bytes: int) -> list[BucketSpec]:
        """The send plan (names, dtypes, shapes per bucket) on rank 0; [] on the other ranks."""
        weights = self.device_weights()
        return bucket_specs(weights.items(), max_bytes) if self.rank == 0 else []

    def broadcast_weights(self, specs: list[BucketSpec]) -> dict[str, Any]:
        """Send every bucket in ``specs`` order (the engines receive in the same order)."""
        weights = self.device_weights()
        if self.rank != 0:
            return {"bytes": 0}
        if self._update_group is None:
            raise RuntimeError("broadcast_weights before init_weight_update_group")
        missing = [n for s in specs for n in s.names if n not in weights]
        if missing:
            raise ValueError(f"the send plan names tensors this rank does not hold: {missing[:5]}")
        sent = NcclSender(self._update_group).send(weights, specs)
        return {"bytes": sent}

    def share_weights_ipc(self, max_bucket_bytes: int) -> tuple[list[str], int]:
        """Colocated sync: the weights in flattened CUDA buckets, as IPC payloads for
        ``/update_weights_from_tensor``, and their bytes (rank 0; ``([], 0)`` elsewhere). This process
        keeps the buckets until ``release_weights_ipc``: the engines read this memory directly."""
        from ..sync.cuda_ipc import IpcProducer

        weights = self.device_weights()
        if self.rank != 0:
            return [], 0
        producer = getattr(self, "_ipc_producer", None) or IpcProducer()
        self._ipc_producer = producer
        payloads = producer.share(weights.items(), max_bucket_bytes)
        return payloads, producer.nbytes

    def release_weights_ipc(self) -> None:
        producer = getattr(self, "_ipc_producer", None)
        if producer is not None:
            producer.release()

    def close_weight_update_group(self) -> None:
        group, self._update_group = self._update_group, None
        if group is not None:
            group.close()
