"""Colocated weight sync by CUDA IPC: the trainer shares flattened GPU buckets, the engine copies.

Wire format (one ``/update_weights_from_tensor`` request per bucket, ``load_format:
"flattened_bucket"``, ``serialized_named_tensors`` one string per TP rank as in SGLang): base64 of a ``ForkingPickler`` pickle (the encoding of SGLang's
``MultiprocessingSerializer``) of ``{"flattened_tensor": <CUDA tensor>, "metadata": [...]}``, where
torch's CUDA reduction turns the tensor into an IPC memory handle plus offsets (no data travels).
``rollout/protocol.py`` tells it from our CPU format (a ``torch.save`` zip) by its first bytes.

Lifetime: the producer (``IpcProducer``, in the trainer rank's process) keeps every bucket alive
until the driver says the engines have answered; the engine copies into its own parameters and
synchronizes before answering, so freeing afterwards is safe. The pickle is read with an unpickler
that only rebuilds CUDA tensors (no arbitrary globals from an HTTP body).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import pickle
from collections.abc import Iterable, Iterator, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # registers torch's CUDA tensor reductions for pickling)
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from .buckets import Bucket, flatten_buckets, unflatten_bucket

PICKLE_PREFIX = b"\x80"  # pickle protocol >= 2; torch.save writes a zip ("PK")
# Larger than the NCCL buckets (DEFAULT_BUCKET_BYTES): all of one sync's IPC buckets are alive at
# once anyway (shared, copied by the engines, then released together), so a larger bucket costs no
# memory, and each bucket is one HTTP request plus an IPC handle opened and closed on the engine
# (about 1.5 ms together on an H200). A 4B model: 194 GB/s with 1 GiB buckets, 244 GB/s with 2 GiB
# (docs/BENCHMARKS.md, session 5).
IPC_BUCKET_BYTES = 2 << 30


def encode_bucket(bucket: Bucket) -> str:
    """IPC handle + metadata of a CUDA bucket, as a string for ``serialized_named_tensors``."""
    if not bucket.flat.is_cuda:
        raise ValueError("CUDA IPC needs a CUDA bucket")
    data = ForkingPickler.dumps({"flattened_tensor": bucket.flat, "metadata": bucket.metadata})
    return base64.b64encode(bytes(data)).decode("ascii")


def _allowed(obj: Any) -> bool:
    if obj is rebuild_cuda_tensor or obj in (torch.Size, torch.device) or isinstance(obj, torch.dtype):
        return True
    storages = (torch.Tensor, torch.storage.TypedStorage, torch.UntypedStorage)
    return isinstance(obj, type) and issubclass(obj, storages)


class _CudaTensorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = super().find_class(module, name)
        if not _allowed(obj):
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a weight payload")
        return obj


def is_ipc_payload(raw: bytes) -> bool:
    return raw[:1] == PICKLE_PREFIX


def decode_bucket(raw: bytes) -> list[tuple[str, torch.Tensor]]:
    """Open the producer's bucket (no copy) and return named views into it."""
    payload = _CudaTensorUnpickler(io.BytesIO(raw)).load()
    if not isinstance(payload, dict) or not isinstance(payload.get("flattened_tensor"), torch.Tensor):
        raise ValueError("a CUDA IPC payload is {'flattened_tensor': tensor, 'metadata': [...]}")
    return unflatten_bucket(payload["flattened_tensor"], list(payload["metadata"]))


def expandable_segments_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the process's allocator config asks for expandable segments (the last setting wins,
    as in torch's parser; PYTORCH_ALLOC_CONF is the newer name of PYTORCH_CUDA_ALLOC_CONF)."""
    found = False
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for item in environ.get(var, "").split(","):
            key, _, value = item.partition(":")
            if key.strip() == "expandable_segments":
                found = value.strip().lower() == "true"
    return found


@contextlib.contextmanager
def plain_segments(environ: Mapping[str, str] = os.environ) -> Iterator[None]:
    """New allocations inside come from ordinary cudaMalloc segments. Training often runs with
    ``expandable_segments:True``; with it, the engine's load of a 4B model's IPC buckets took 92 ms
    on an H100 (docs/BENCHMARKS.md, session 4). torch can switch the setting at runtime."""
    switch = expandable_segments_requested(environ) and torch.cuda.is_available()
    if switch:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    try:
        yield
    finally:
        if switch:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")


class IpcProducer:
    """Trainer side: flatten, share, keep alive until ``release``."""

    def __init__(self) -> None:
        self._alive: list[Bucket] = []

    def share(
        self, named: Iterable[tuple[str, torch.Tensor]], max_bytes: int = IPC_BUCKET_BYTES
    ) -> list[str]:
        """One payload string per bucket; the buckets stay allocated until ``release``."""
        self.release()
        with torch.no_grad(), plain_segments():
            buckets = flatten_buckets(named, max_bytes)
        if not all(b.flat.is_cuda for b in buckets):
            raise ValueError("CUDA IPC needs CUDA tensors")
        # the engine reads on its own stream: the flatten copies must be done first
        torch.cuda.synchronize()
        self._alive = buckets
        return [encode_bucket(b) for b in buckets]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._alive)

    def release(self) -> None:
        self._alive = []
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()  # free blocks the engines have let go of
