"""The optimizer's state in pinned host memory, streamed through the GPU at each step
(``training.offloadOptimizer``; what megatron-core's ``--optimizer-cpu-offload`` is for, which needs
TransformerEngine in 0.16).

Megatron's distributed optimizer keeps, per parameter shard, an fp32 main copy and two fp32 Adam
moments: 12 of the 16-18 bytes per parameter of mixed-precision Adam (a 4B model: 48 GB of an 80 GB
GPU). Here those tensors live on the host between steps: their storages are copied into pinned
buffers and resized to 0 bytes (the storage swap of ``trainer/offload.py``, per tensor), so every
Megatron structure keeps pointing at the same tensor objects. The step then walks the parameters in
chunks of about ``chunk_bytes``: bring the chunk's main params and moments in, run the (fused) Adam
update on them alone (the torch optimizer's param groups narrowed to the chunk), write the chunk's
updated weights into the bf16 model params (Megatron's own main -> model copy, narrowed the same
way), send the chunk back out. The update is the same kernels on the same values as without offload.

The GPU then holds the bf16 weights, the fp32 gradient buffer, activations and one chunk, at the
cost of moving the state in and out once per optimizer step (host <-> device copies on the current
stream: ordered with the update kernels, so no synchronisation is needed until the host reads).
Checkpoint saves and loads read every tensor: ``resident()`` brings all of it back for their
duration (a GPU that cannot hold the whole state for a moment cannot checkpoint this way: not yet
streamed).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..offload import _bytes  # a uint8 tensor over a whole storage (the same swap)
from .fusions import torch_optimizers

# Adam's per-parameter state tensors that move with their parameter ("step" is a scalar: stays).
STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
# (main params, model params) attribute pairs of megatron-core's DistributedOptimizer, zipped
# element-wise by its _copy_main_params_to_model_params.
GROUP_PAIRS = (
    ("shard_fp32_from_float16_groups", "model_float16_groups"),
    ("shard_fp32_groups", "model_fp32_groups"),
)
DEFAULT_CHUNK_BYTES = 2 << 30


@dataclass
class _Item:
    group: int  # index into the torch optimizer's param_groups
    param: torch.Tensor
    swap: bool  # False: a view into Megatron's param buffer (fp32 model params): never freed


@dataclass
class OffloadStats:
    steps: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    chunks: int = 0
    seconds: float = 0.0


@dataclass
class OptimizerStateOffload:
    """Installed on a Megatron distributed optimizer (``install``); see the module docstring."""

    optimizer: Any  # megatron-core DistributedOptimizer (or a ChainedOptimizer of one)
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    stats: OffloadStats = field(default_factory=OffloadStats)
    _host: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    _in_step: bool = False
    _copied: bool = False  # the last step wrote the model params already (chunk by chunk)

    def __post_init__(self) -> None:
        self.dist = _distributed_optimizer(self.optimizer)
        inners = torch_optimizers(self.dist)
        if len(inners) != 1:
            raise ValueError(f"offloadOptimizer: expected one torch optimizer, found {len(inners)}")
        self.inner: torch.optim.Optimizer = inners[0]
        owned = {id(p) for p in _pairs_params(self.dist, GROUP_PAIRS[0][0])}
        self.items = [
            _Item(g, p, swap=id(p) in owned)
            for g, group in enumerate(self.inner.param_groups)
            for p in group["params"]
        ]
        for item in self.items:
            if (
                item.swap
                and item.param.untyped_storage().nbytes() != item.param.numel() * item.param.element_size()
            ):
                # Freeing a shared storage would free what else lives in it (a DDP buffer).
                raise ValueError(
                    "offloadOptimizer: a main parameter shares its storage with other tensors; "
                    "only megatron-core's distributed optimizer with bf16/fp16 params is supported"
                )
        self._orig_step: Callable[..., Any] = self.inner.step
        self._orig_copy: Callable[[], None] = self.dist._copy_main_params_to_model_params
        self._orig_copy_in: Callable[..., None] = self.dist._copy_model_params_to_main_params

    @property
    def device(self) -> torch.device:
        return self.items[0].param.device if self.items else torch.device("cpu")

    def install(self) -> OptimizerStateOffload:
        """Take over the inner step and the main -> model copy, and move the state off the GPU."""
        self.inner.step = self._step  # type: ignore[method-assign,assignment]  # instance override, by design
        self.dist._copy_main_params_to_model_params = self._copy_main_to_model
        self.dist._copy_model_params_to_main_params = self._copy_model_to_main
        self.evict(self.items)
        return self

    # ------------------------------------------------------------------------------- moving

    def _tensors(self, item: _Item) -> Iterator[tuple[str, torch.Tensor]]:
        if not item.swap:
            return
        yield "param", item.param
        state = self.inner.state.get(item.param, {})
        for key in STATE_KEYS:
            value = state.get(key)
            if isinstance(value, torch.Tensor):
                yield key, value

    def evict(self, items: list[_Item], stream: Any = None) -> int:
        """Copy the items' tensors to their pinned buffers and free their device memory; the copies
        run on ``stream`` (a CUDA stream) when given, else on the current one."""
        moved = 0
        with _on(stream):
            for index, item in self._indexed(items):
                for key, tensor in self._tensors(item):
                    storage = tensor.untyped_storage()
                    nbytes = storage.nbytes()
                    if nbytes == 0:
                        continue  # out already
                    host = self._host_buffer((index, key), nbytes)
                    view = _bytes(storage)
                    host.copy_(view, non_blocking=True)
                    if stream is not None:
                        view.record_stream(stream)  # the block is not reused before the copy out is done
                    # Freed now; the caching allocator reuses the block only after the work queued
                    # on it (same stream, or the streams recorded) has run.
                    storage.resize_(0)
                    moved += nbytes
        self.stats.bytes_out += moved
        return moved

    def fetch(self, items: list[_Item], stream: Any = None, used_on: Any = None) -> int:
        """Give the items' tensors their device memory back and copy their bytes in (on ``stream``
        when given; ``used_on``: the stream that will use them, recorded on the blocks)."""
        moved = 0
        with _on(stream):
            for index, item in self._indexed(items):
                for key, tensor in self._tensors(item):
                    storage = tensor.untyped_storage()
                    host = self._host.get((index, key))
                    if storage.nbytes() != 0 or host is None:
                        continue  # resident already, or created after the last eviction
                    storage.resize_(host.numel())
                    view = _bytes(storage)
                    view.copy_(host, non_blocking=True)
                    if used_on is not None:
                        view.record_stream(used_on)
                    moved += host.numel()
        self.stats.bytes_in += moved
        return moved

    def _indexed(self, items: list[_Item]) -> Iterator[tuple[int, _Item]]:
        positions = {id(item): i for i, item in enumerate(self.items)}
        return ((positions[id(item)], item) for item in items)

    def _host_buffer(self, key: tuple[int, str], nbytes: int) -> torch.Tensor:
        buffer = self._host.get(key)
        if buffer is None or buffer.numel() != nbytes:
            pin = self.device.type == "cuda"
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            self._host[key] = buffer
        return buffer

    def host_bytes(self) -> int:
        return sum(b.numel() for b in self._host.values())

    def device_bytes(self) -> int:
        """Bytes of the swappable state on the device now (0 between steps)."""
        return sum(t.untyped_storage().nbytes() for item in self.items for _, t in self._tensors(item))

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        """All of the state on the device for the block (checkpoint save/load), then out again
        (including state the block created, e.g. moments a checkpoint load initialised)."""
        self.fetch(self.items)
        if self.device.type == "cuda":
            # The checkpoint writer copies the state to host memory itself: the pinned copies would
            # double the host's share (a 4B: 48 GB of them beside its 56 GB of checkpoint tensors), so
            # they are given up here and pinned again on the way out.
            torch.cuda.synchronize(self.device)
            self._host.clear()
            # Freed pinned blocks stay in PyTorch's host caching allocator (still resident, still
            # pinned) until emptied: a 4B's final save reached 112 GB of host RSS without this.
            release = getattr(torch._C, "_host_emptyCache", None)
            if release is not None:
                release()
        try:
            yield
        finally:
            self.evict(self.items)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the host copies are complete when we return

    # -------------------------------------------------------------------------------- step

    def chunks(self) -> list[list[_Item]]:
        """Consecutive parameters, about ``chunk_bytes`` of params + moments each (Adam: 3 fp32
        tensors per parameter); a parameter above the limit is a chunk of its own."""
        out: list[list[_Item]] = [[]]
        size = 0
        for item in self.items:
            need = 3 * item.param.numel() * item.param.element_size()
            if out[-1] and size + need > self.chunk_bytes:
                out.append([])
                size = 0
            out[-1].append(item)
            size += need
        return [chunk for chunk in out if chunk]

    @torch.no_grad()
    def _step(self, closure: Any = None) -> None:
        """The update, chunk by chunk. On CUDA the copies run on two side streams, so chunk i + 1
        comes in and chunk i - 1 goes out while chunk i is updated (host -> device and device -> host
        use separate copy engines); the host waits for chunk i - 1 to be out before it brings i + 1
        in, so at most three chunks are on the GPU at once."""
        if closure is not None:
            raise NotImplementedError("offloadOptimizer: a step closure")
        started = time.perf_counter()
        groups = self.inner.param_groups
        saved = [group["params"] for group in groups]
        chunks = self.chunks()
        cuda = self.device.type == "cuda"
        main: Any = torch.cuda.current_stream(self.device) if cuda else None
        s_in: Any = torch.cuda.Stream(self.device) if cuda else None
        s_out: Any = torch.cuda.Stream(self.device) if cuda else None
        done: list[Any] = []  # per chunk: its copies out have finished (a CUDA event)
        self._in_step = True
        try:
            if cuda:
                s_in.wait_stream(main)  # the host buffers' last copies out are done
            if chunks:
                self.fetch(chunks[0], s_in, main)
            for i, chunk in enumerate(chunks):
                if cuda:
                    main.wait_stream(s_in)  # chunk i is in
                if i + 1 < len(chunks):
                    if cuda and i >= 1:
                        # The host runs ahead of the GPU: without this wait it would queue every chunk's
                        # copies, and the blocks of chunks sent out but not yet reusable would pile up
                        # until the whole state sat on the GPU. Chunk i - 1 is out before i + 1 comes in.
                        done[i - 1].synchronize()
                    self.fetch(chunks[i + 1], s_in, main)
                for g, group in enumerate(groups):
                    group["params"] = [item.param for item in chunk if item.group == g]
                self._orig_step()
                self._copy_chunk_to_model(chunk)
                if cuda:
                    s_out.wait_stream(main)  # chunk i is updated
                self.evict(chunk, s_out)
                if cuda:
                    done.append(s_out.record_event())
                self.stats.chunks += 1
            if cuda:
                main.wait_stream(s_out)  # the host copies precede what follows
        finally:
            for group, params in zip(groups, saved, strict=True):
                group["params"] = params
            self._in_step = False
        self._copied = True
        self.stats.steps += 1
        self.stats.seconds += time.perf_counter() - started  # enqueue time: the GPU may still run

    def _copy_chunk_to_model(self, chunk: list[_Item]) -> None:
        """Megatron's main -> model param copy for the chunk's parameters only (its group lists
        narrowed to them for the call)."""
        keep = {id(item.param) for item in chunk}
        saved = {name: getattr(self.dist, name) for pair in GROUP_PAIRS for name in pair}
        try:
            for main_name, model_name in GROUP_PAIRS:
                mains, models = saved[main_name], saved[model_name]
                narrowed = [
                    [(s, m) for s, m in zip(ms, mo, strict=True) if id(s) in keep]
                    for ms, mo in zip(mains, models, strict=True)
                ]
                setattr(self.dist, main_name, [[s for s, _ in g] for g in narrowed])
                setattr(self.dist, model_name, [[m for _, m in g] for g in narrowed])
            self._orig_copy()
        finally:
            for name, value in saved.items():
                setattr(self.dist, name, value)

    def _copy_main_to_model(self) -> None:
        """Megatron calls this right after the inner step (``step_with_ready_grads``), which did it
        chunk by chunk already, and when it reloads parameters: then every main param comes in."""
        if self._in_step:
            return
        if self._copied:
            self._copied = False
            return
        with self.resident():
            self._orig_copy()

    def _copy_model_to_main(self, *args: Any, **kwargs: Any) -> None:
        """Megatron's model -> main copy (loading, reloading parameters), with the main params in.
        A freed storage is not checked on access: touching one outside these paths would read or
        write memory that is not the tensor's, so every Megatron path that reads them is wrapped."""
        with self.resident():
            self._orig_copy_in(*args, **kwargs)


def _on(stream: Any) -> contextlib.AbstractContextManager[Any]:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _distributed_optimizer(optimizer: Any) -> Any:
    members = getattr(optimizer, "chained_optimizers", None)
    if members is not None:
        if len(members) != 1:
            raise ValueError(f"offloadOptimizer: {len(members)} chained optimizers (expected one)")
        optimizer = members[0]
    if not all(hasattr(optimizer, name) for pair in GROUP_PAIRS for name in pair):
        raise TypeError(
            f"offloadOptimizer needs megatron-core's distributed optimizer, not {type(optimizer).__name__}"
        )
    return optimizer


def _pairs_params(dist_opt: Any, name: str) -> list[torch.Tensor]:
    return [p for group in getattr(dist_opt, name) for p in group if isinstance(p, torch.Tensor)]
