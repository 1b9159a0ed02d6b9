"""Colocated weight sync by CUDA IPC: the trainer shares flattened GPU buckets, the engine copies.

Wire format: SGLang's ``/update_weights_from_tensor`` with ``load_format: "flattened_bucket"``; each
string of ``serialized_named_tensors`` (one per TP rank of the engine) is what SGLang's
``MultiprocessingSerializer.serialize(obj, output_str=True)`` writes: the base64 of a
``ForkingPickler`` pickle of ``{"flattened_tensor": <CUDA uint8 tensor>, "metadata": [...]}`` in
SGLang's bucket layout (``buckets.py``). torch's CUDA reduction turns the tensor into an IPC memory
handle plus offsets; no data travels. Two codecs fill ``metadata``:

- ``sglang``: SGLang's own ``FlattenedTensorMetadata`` objects (its weight updater reads their
  attributes; its ``SafeUnpickler`` admits that module), pickled after SGLang's
  ``monkey_patch_torch_reductions``, which names the producer's GPU by UUID so an engine that sees
  another set of devices opens the handle on the right one. Imports SGLang, which the runtime image
  has wherever engines are SGLang.
- ``rljob``: plain dicts, for our ``hf`` engine (no SGLang needed); ``engine_api.py`` tells the
  payload from our CPU format (a ``torch.save`` zip) by its first bytes.

Lifetime: the producer (``IpcProducer``, in trainer rank 0's process) keeps a bucket until the
engines answered its request and at most two buckets at once (one loading, the next one being
flattened), so a sync needs two buckets of GPU memory, not the model's size. The engine copies into
its parameters before answering; torch keeps a shared block from being reused while a consumer
still holds it. The ``rljob`` payload is read with an unpickler that only rebuilds CUDA tensors.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import pickle
from collections.abc import Iterator, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal

import torch
import torch.multiprocessing  # registers torch's CUDA tensor reductions for pickling
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from .buckets import Bucket, flatten_bucket, torch_dtype, unflatten_bucket

Codec = Literal["sglang", "rljob"]
PICKLE_PREFIX = b"\x80"  # pickle protocol >= 2; torch.save writes a zip ("PK")
# Two buckets live at once (``IpcProducer``): 1 GiB each keeps a sync within 2 GiB of GPU memory,
# which colocated runs lack. Larger buckets mean fewer requests (each costs the engine a few ms).
IPC_BUCKET_BYTES = 1 << 30


def _sglang_metadata(metadata: list[dict[str, Any]]) -> list[Any]:
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    return [
        FlattenedTensorMetadata(
            name=m["name"],
            shape=torch.Size(m["shape"]),
            dtype=torch_dtype(m["dtype"]),
            start_idx=m["start_idx"],
            end_idx=m["end_idx"],
            numel=m["numel"],
        )
        for m in metadata
    ]


def patch_reductions_for_sglang() -> None:
    """SGLang's own patch (idempotent): CUDA tensors pickle their device as a UUID."""
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    monkey_patch_torch_reductions()


def encode_bucket(bucket: Bucket, codec: Codec = "rljob") -> str:
    """IPC handle + metadata of a CUDA bucket, as one string of ``serialized_named_tensors``."""
    if not bucket.flat.is_cuda:
        raise ValueError("CUDA IPC needs a CUDA bucket")
    metadata: list[Any] = bucket.metadata
    if codec == "sglang":
        patch_reductions_for_sglang()
        metadata = _sglang_metadata(bucket.metadata)
    elif codec != "rljob":
        raise ValueError(f"unknown IPC codec {codec!r}: sglang or rljob")
    data = ForkingPickler.dumps({"flattened_tensor": bucket.flat, "metadata": metadata})
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
    """Open the producer's bucket (no copy) and return named views into it (``rljob`` codec)."""
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
    on an H100 (docs/BENCHMARKS.md, commit b7644a7). torch can switch the setting at runtime."""
    switch = expandable_segments_requested(environ) and torch.cuda.is_available()
    if switch:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    try:
        yield
    finally:
        if switch:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")


class IpcProducer:
    """Trainer side of one sync: the bucket plan, then one shared bucket at a time, at most two alive."""

    def __init__(
        self, plan: list[list[tuple[str, torch.Tensor]]], codec: Codec, cast: torch.dtype | None
    ) -> None:
        self.plan, self.codec, self.cast = plan, codec, cast
        self._alive: dict[int, Bucket] = {}
        self.nbytes = 0

    def share(self, index: int) -> str:
        """Flatten bucket ``index`` and return its payload. Asked for only after the engines answered
        bucket ``index - 2``, which is freed here: two buckets live at once, one loading, one new."""
        self._alive.pop(index - 2, None)
        with torch.no_grad(), plain_segments():
            bucket = flatten_bucket(self.plan[index], self.cast)
        if not bucket.flat.is_cuda:
            raise ValueError("CUDA IPC needs CUDA tensors")
        # the engine reads on its own stream: the flatten copies must be done first
        torch.cuda.synchronize()
        self._alive[index] = bucket
        self.nbytes += bucket.nbytes
        return encode_bucket(bucket, self.codec)

    @property
    def alive_bytes(self) -> int:
        return sum(b.nbytes for b in self._alive.values())

    def release(self) -> None:
        self._alive.clear()
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()  # free blocks the engines have let go of
