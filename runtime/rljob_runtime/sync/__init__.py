"""Weight sync from the trainer to the rollout engines: one transport class per way the bytes travel.

| transport | when | engine endpoint |
| --- | --- | --- |
| ``IpcTransport`` (``ipc.py``) | cuda, colocated (one node) | ``/update_weights_from_tensor``, CUDA IPC buckets |
| ``DistributedTransport`` (``distributed.py``) | cuda, engines on GPUs of their own | ``/update_weights_from_distributed``, NCCL |
| ``DiskTransport`` (``disk.py``) | cpu, trainer and engines on one node; the GPU fallback | ``/update_weights_from_disk`` |
| ``TensorTransport`` (``tensor.py``) | cpu, trainer and engines on different nodes (hf engine) | ``/update_weights_from_tensor``, rljob's CPU format |

Every update bumps the weight version and runs pause -> flush (retried) -> transfer -> version ->
continue on each engine (``RolloutManager.updating``); a relaunched engine is brought to the current
version by the same transport (``refresh``). Colocated across nodes is refused with a clear message
(an engine sharing a GPU with a trainer rank cannot join its NCCL group, and IPC does not cross nodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .base import WeightTransport
from .buckets import DEFAULT_BUCKET_BYTES
from .cuda_ipc import IPC_BUCKET_BYTES, Codec

if TYPE_CHECKING:  # lazily: engines import sync.cuda_ipc without the API package
    from rljob_api.spec import RLTrainingJobSpec

Transport = Literal["tensors", "disk", "cuda_ipc", "nccl"]


def choose_transport(spec: RLTrainingJobSpec, *, single_node: bool = False) -> Transport:
    """CPU: a safetensors file in shared memory when everything runs on one node (fastest: no
    encoding, one copy each way), else named tensors over HTTP. GPU: CUDA IPC when colocated (on one
    node: ``check_supported`` refuses more), NCCL broadcast when the engines have GPUs of their own."""
    if spec.resources.device == "cuda":
        return "cuda_ipc" if spec.resources.colocate else "nccl"
    return "disk" if single_node and Path("/dev/shm").is_dir() else "tensors"


def check_supported(spec: RLTrainingJobSpec, *, single_node: bool | None = None) -> None:
    """Refuse what cannot sync: on cuda, colocated across nodes. ``single_node`` None judges from the
    spec's trainer nodes (the support matrix's rule, which the API server applies at admission);
    otherwise from where Ray placed the actors. Either way the message is the matrix's."""
    from rljob_api.support import colocated_nodes_limit

    limit = colocated_nodes_limit(spec.resources.device)
    if limit is None:
        return
    fits = limit.supported(spec) if single_node is None else single_node or not spec.resources.colocate
    if not fits:
        raise NotImplementedError(limit.problem())


def make_transport(
    spec: RLTrainingJobSpec,
    *,
    single_node: bool,
    model_path: str | None = None,
    transport: Transport | None = None,
    bucket_bytes: int | None = None,
    group_backend: str = "nccl",
) -> WeightTransport:
    """The transport for this run (``transport`` overrides the choice; ``group_backend="gloo"`` runs
    the NCCL protocol between CPU processes, as the CPU tests do). Weights travel in the engines'
    dtype (``model.dtype``): a torch trainer's fp32 master weights are cast on the way."""
    from .disk import DiskTransport
    from .distributed import DistributedTransport
    from .ipc import IpcTransport
    from .tensor import TensorTransport

    check_supported(spec, single_node=single_node)
    kind = transport or choose_transport(spec, single_node=single_node)
    cast = spec.model.dtype if spec.resources.device == "cuda" else None
    if kind == "cuda_ipc":
        codec: Codec = "sglang" if spec.rollout.engine == "sglang" else "rljob"
        return IpcTransport(codec, cast, bucket_bytes or IPC_BUCKET_BYTES)
    if kind == "nccl":
        return DistributedTransport(cast, bucket_bytes or DEFAULT_BUCKET_BYTES, group_backend)
    if kind == "disk":
        return DiskTransport(model_path)
    return TensorTransport()


__all__ = ["Transport", "WeightTransport", "check_supported", "choose_transport", "make_transport"]
