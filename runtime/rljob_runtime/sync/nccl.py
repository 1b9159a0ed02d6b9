"""Disaggregated weight sync by NCCL broadcast: the trainer's rank 0 sends, every engine receives.

SGLang's protocol: ``/init_weights_update_group`` makes each engine join a process group hosted by
the trainer (rank 0; engine ranks from ``rank_offset``), then per bucket ``/update_weights_from_
distributed`` tells the engines the names, dtypes and shapes (``load_format: "flattened_bucket"``)
while the trainer broadcasts the bucket's bytes on that group.

A bucket travels as one ``uint8`` tensor: the named tensors' bytes back to back, in order, which is
SGLang's ``FlattenedTensorBucket`` layout, so both sides agree on count and type whatever the dtype.
The group is a bare ``ProcessGroupNCCL`` on a ``TCPStore``, not a torch.distributed group: neither
the trainer (which has its own world) nor the hf engine (which has none) needs a default group. The
store keys carry the prefixes torch's ``_new_process_group_helper`` adds under SGLang's
``init_custom_process_group`` (group name, ``<group>/``, ``cuda/``), so a real SGLang engine's
rendezvous finds ours; that pairing is by reading their source, not run here (no SGLang on CPU).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .buckets import DEFAULT_BUCKET_BYTES, dtype_name, plan_buckets, target_dtype, torch_dtype
from .copy import copy_all


@dataclass(frozen=True)
class BucketSpec:
    """What an engine needs to receive one bucket: the body of ``/update_weights_from_distributed``
    without the group name and version."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def nbytes(self) -> int:
        return sum(
            _numel(shape) * torch_dtype(d).itemsize for d, shape in zip(self.dtypes, self.shapes, strict=True)
        )

    def body(self, group_name: str, weight_version: str | None = None) -> dict[str, Any]:
        """Flushed before the transfer already (pause -> flush -> update -> continue), so no flush."""
        from .. import engine_api

        return engine_api.update_weights_from_distributed_body(
            names=self.names,
            dtypes=self.dtypes,
            shapes=self.shapes,
            group_name=group_name,
            weight_version=weight_version,
            load_format="flattened_bucket",
        )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def bucket_specs(
    named: Iterable[tuple[str, torch.Tensor]],
    max_bytes: int = DEFAULT_BUCKET_BYTES,
    cast: torch.dtype | None = None,
) -> list[BucketSpec]:
    """The buckets (one dtype each, at most ``max_bytes`` unless one tensor is larger) in send order;
    floating tensors travel as ``cast`` when given (``buckets.target_dtype``)."""
    return [
        BucketSpec(
            tuple(n for n, _ in items),
            tuple(dtype_name(target_dtype(t, cast)) for _, t in items),
            tuple(tuple(t.shape) for _, t in items),
        )
        for items in plan_buckets(named, max_bytes, cast)
    ]


def pack(tensors: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype] | None = None) -> torch.Tensor:
    """The tensors' bytes back to back in one new uint8 tensor (the sender's bucket), each cast to its
    entry of ``dtypes`` (default: its own dtype) on the way."""
    dtypes = list(dtypes) if dtypes is not None else [t.dtype for t in tensors]
    total = sum(t.numel() * d.itemsize for t, d in zip(tensors, dtypes, strict=True))
    flat = torch.empty(total, dtype=torch.uint8, device=tensors[0].device)
    pairs, start = [], 0
    for t, dtype in zip(tensors, dtypes, strict=True):
        size = t.numel() * dtype.itemsize
        if start % dtype.itemsize:
            raise ValueError(f"byte offset {start} is not aligned for {dtype}")
        # straight into the slice, viewed as the dtype and shape: no contiguous temporary
        pairs.append((flat[start : start + size].view(dtype).view(t.shape), t.detach()))
        start += size
    copy_all(pairs)
    return flat


def unpack(flat: torch.Tensor, spec: BucketSpec) -> list[tuple[str, torch.Tensor]]:
    """Named views (no copy) into a received uint8 bucket; checks sizes and alignment."""
    if spec.nbytes != flat.numel():
        raise ValueError(f"bucket of {flat.numel()} bytes, its tensors need {spec.nbytes}")
    out, start = [], 0
    for name, travelling, shape in zip(spec.names, spec.dtypes, spec.shapes, strict=True):
        dtype = torch_dtype(travelling)
        if start % dtype.itemsize:
            raise ValueError(f"{name!r}: byte offset {start} is not aligned for {travelling}")
        size = _numel(shape) * dtype.itemsize
        out.append((name, flat[start : start + size].view(dtype).view(tuple(shape))))
        start += size
    return out


def spec_from_body(body: dict[str, Any]) -> BucketSpec:
    """The request's names/dtypes/shapes, checked: the lists must be non-empty and of equal length."""
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
        raise ValueError("names, dtypes and shapes are required lists")
    if not names or not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names, dtypes, shapes: {len(names)}, {len(dtypes)}, {len(shapes)} entries")
    if any(int(s) < 0 for shape in shapes for s in shape):
        raise ValueError("negative dimension in shapes")
    for d in dtypes:
        torch_dtype(str(d))  # refused here, before the engine waits on a broadcast
    return BucketSpec(
        tuple(map(str, names)), tuple(map(str, dtypes)), tuple(tuple(map(int, s)) for s in shapes)
    )


class WeightUpdateGroup:
    """One side of a weight-update group: rank 0 (the trainer) hosts the store and sends.

    ``backend`` "nccl" on GPUs; "gloo" moves the same buckets between CPU processes, which is how
    the protocol (endpoints, ordering, bucket layout) is tested without GPUs."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str = "weight_update_group",
        *,
        backend: str = "nccl",
        device: torch.device | None = None,
        timeout_s: float = 600,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a group of {world_size}")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend {backend!r}: nccl (GPUs) or gloo (CPU)")
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        if device is None:
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if backend == "nccl"
                else torch.device("cpu")
            )
        self.device = device
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(master_address, master_port, world_size, rank == 0, timeout=timeout)
        kind = "cuda" if backend == "nccl" else "cpu"
        prefixed = dist.PrefixStore(
            f"{kind}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store))
        )
        self._store = store  # the server lives as long as rank 0's group
        if backend == "nccl":
            self.pg: Any = dist.ProcessGroupNCCL(prefixed, rank, world_size, timeout)  # type: ignore[arg-type]  # stubs lack this overload
        else:
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """The tensor is sent (src) or filled (others) when this returns: for gloo on the CPU; for NCCL
        as far as the current stream is concerned (its later work waits for the broadcast)."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        if self.backend == "nccl":
            with torch.cuda.device(self.device):
                self.pg.broadcast([tensor], opts).wait()
        else:
            self.pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        """Leave the group at once. ``abort`` and not ``shutdown``: NCCL's graceful finalize can wait
        for the peers, and each side leaves on its own (the engine inside an HTTP request the trainer
        waits on), so a graceful close could deadlock. The group is idle when it is closed."""
        with contextlib.suppress(RuntimeError, AttributeError):  # already aborted, or a torch without it
            self.pg.abort()


class NcclSender:
    """Trainer side: plan the buckets once, then broadcast them in that order on every sync."""

    def __init__(self, group: WeightUpdateGroup) -> None:
        if group.rank != 0:
            raise ValueError("the trainer sends as rank 0 of the weight-update group")
        self.group = group

    def send(self, named: dict[str, torch.Tensor], specs: Sequence[BucketSpec]) -> int:
        """Broadcast each bucket, packed on this device. NCCL returns to the CPU before the bytes
        moved, so the CPU waits for bucket i - 2 before packing bucket i: at most two packed buckets
        exist at once, not the model. On the GPU the packs and broadcasts run one after the other
        (the broadcast's wait orders the current stream); a pack is a device copy, a few ms per GB."""
        sent = 0
        done: list[torch.cuda.Event | None] = []  # each bucket's broadcast (no event on the CPU)
        for i, spec in enumerate(specs):
            older = done[i - 2] if i >= 2 else None
            if older is not None:
                older.synchronize()
            flat = pack([named[n] for n in spec.names], [torch_dtype(d) for d in spec.dtypes])
            self.group.broadcast(flat)
            sent += flat.numel()
            event = None
            if flat.is_cuda:
                event = torch.cuda.Event()
                event.record()
            done.append(event)
            del flat  # the allocator keeps it until NCCL's stream is past it (recorded by the group)
        last = done[-1] if done else None
        if last is not None:
            last.synchronize()
        return sent


def receive(group: WeightUpdateGroup, spec: BucketSpec) -> list[tuple[str, torch.Tensor]]:
    """Engine side: allocate the bucket, receive it from rank 0, return named views into it.

    Stream-ordered, not host-synchronous (as SGLang's receiver): work queued after this on the
    current stream (the load's copies, then generation) sees the bytes; the CPU does not wait, so
    the engine can answer and take the next bucket's request while this one is still arriving."""
    flat = torch.empty(spec.nbytes, dtype=torch.uint8, device=group.device)
    group.broadcast(flat, src=0)
    return unpack(flat, spec)


def receive_each(group: WeightUpdateGroup, spec: BucketSpec) -> list[tuple[str, torch.Tensor]]:
    """SGLang's default (no ``load_format``): one broadcast per tensor, in the listed order
    (stream-ordered, as ``receive``)."""
    out = []
    for name, travelling, shape in zip(spec.names, spec.dtypes, spec.shapes, strict=True):
        tensor = torch.empty(shape, dtype=torch_dtype(travelling), device=group.device)
        group.broadcast(tensor, src=0)
        out.append((name, tensor))
    return out
