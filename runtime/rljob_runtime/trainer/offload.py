"""The trainer's state off the GPU while colocated engines generate, and back for the step (slime's
``--offload``; ``colocation.Turns`` decides when).

A storage swap, the way PyTorch FSDP frees flat parameters and Megatron frees its DDP buffers
(``offload_to_cpu``): every distinct storage of a group's tensors is copied into a pinned CPU buffer
and resized to 0 bytes; ``onload`` resizes it back and copies the bytes in. The tensors themselves
stay: Megatron's parameters (views into DDP's contiguous param buffer), ``main_grad`` views, the
optimizer's references all keep pointing at the same storage objects and are valid again after
``onload``. Groups are callables, asked at each offload, so tensors made later (optimizer state
after the first step, gradients after the first backward) are found. A group marked ``keep=False``
(gradients, rewritten before they are read) is freed without a copy and comes back zeroed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..host_memory import read_host_memory

Tensors = Callable[[], Iterable[torch.Tensor | None]]


@dataclass
class Group:
    tensors: Tensors
    keep: bool = True  # False: contents need not survive (gradients): no copy, zeros on return


@dataclass
class _Swapped:
    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None  # the bytes, pinned on the CPU (None when not kept)


@dataclass
class StorageOffloader:
    """Moves named groups of tensors' storages off ``device`` and back (see the module docstring)."""

    groups: dict[str, Group]
    device: torch.device
    _swapped: dict[str, list[_Swapped]] = field(default_factory=dict)
    _buffers: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # reused pinned memory

    def is_offloaded(self, group: str) -> bool:
        return group in self._swapped

    def nbytes(self, group: str) -> int:
        """Bytes of the group's storages on the device now (0 while offloaded)."""
        return sum(s.nbytes() for s in self._storages(group, set()))

    def _storages(self, group: str, seen: set[int]) -> list[torch.UntypedStorage]:
        """The group's distinct, allocated storages on the device not claimed by an earlier group."""
        out = []
        for tensor in self.groups[group].tensors():
            if tensor is None or tensor.device != self.device:
                continue
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            out.append(storage)
        return out

    def offload(self, groups: Iterable[str] | None = None) -> int:
        """Free the groups' device memory (kept groups copied to CPU first); bytes freed."""
        names = [g for g in (groups or self.groups) if not self.is_offloaded(g)]
        seen: set[int] = set()
        for name in self.groups:  # a storage belongs to the first group that claims it
            if name not in names and not self.is_offloaded(name):
                self._storages(name, seen)
        plans = {name: self._storages(name, seen) for name in names}
        freed = 0
        for name, storages in plans.items():
            swapped = []
            for index, storage in enumerate(storages):
                host = None
                if self.groups[name].keep:
                    host = self._host_buffer(name, index, storage.nbytes())
                    host.copy_(_bytes(storage), non_blocking=True)
                swapped.append(_Swapped(storage, storage.nbytes(), host))
            self._swapped[name] = swapped
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the copies out are done before the memory goes
        for swapped in (self._swapped[n] for n in names):
            for item in swapped:
                item.storage.resize_(0)
                freed += item.nbytes
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return freed

    def onload(self, groups: Iterable[str] | None = None) -> int:
        """Bring the groups back (kept bytes copied in, the rest zeroed); bytes restored."""
        restored = 0
        for name in [g for g in (groups or self.groups) if self.is_offloaded(g)]:
            for item in self._swapped.pop(name):
                item.storage.resize_(item.nbytes)
                target = _bytes(item.storage)
                if item.host is not None:
                    target.copy_(item.host, non_blocking=True)
                else:
                    target.zero_()
                restored += item.nbytes
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return restored

    @contextlib.contextmanager
    def resident(self, group: str) -> Iterator[None]:
        """``group`` on the device for the block; offloaded again after if it was before."""
        was_offloaded = self.is_offloaded(group)
        if was_offloaded:
            self.onload([group])
        try:
            yield
        finally:
            if was_offloaded:
                self.offload([group])

    def _host_buffer(self, group: str, index: int, nbytes: int) -> torch.Tensor:
        key = (group, index)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() != nbytes:
            pin = self.device.type == "cuda" and torch.cuda.is_available()
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            self._buffers[key] = buffer
        return buffer


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def module_tensors(*modules: torch.nn.Module | None) -> Iterator[torch.Tensor]:
    for module in modules:
        if module is not None:
            yield from module.parameters()
            yield from module.buffers()


def grads(*modules: torch.nn.Module | None) -> Iterator[torch.Tensor | None]:
    for module in modules:
        if module is not None:
            for param in module.parameters():
                yield param.grad
                yield getattr(param, "main_grad", None)


def optimizer_tensors(*optimizers: Any) -> Iterator[torch.Tensor]:
    """Parameters and state tensors of torch optimizers, or of the torch optimizers inside Megatron's
    (``trainer.megatron.fusions.torch_optimizers`` unwraps chained / distributed ones)."""
    for optimizer in optimizers:
        if optimizer is None:
            continue
        inner = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else _torch_optimizers(optimizer)
        for opt in inner:
            for group in opt.param_groups:
                yield from (p for p in group["params"] if isinstance(p, torch.Tensor))
            for state in opt.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    from .megatron.fusions import torch_optimizers

    return torch_optimizers(optimizer)


class Offloadable:
    """A trainer rank's turns on a shared GPU; the backend provides ``device`` and ``_offload_groups``
    (at least "weights": what exporting the weights reads)."""

    device: torch.device
    _offloader: StorageOffloader | None = None

    def _offload_groups(self) -> dict[str, Group]:
        raise NotImplementedError

    def _offloader_ready(self) -> StorageOffloader | None:
        if self.device.type != "cuda":
            return None  # nothing to give up on a CPU
        if self._offloader is None:
            self._offloader = StorageOffloader(self._offload_groups(), self.device)
        return self._offloader

    def offload(self) -> dict[str, float]:
        """The rank's parameters, gradients and optimizer state to pinned CPU memory."""
        started, offloader = time.perf_counter(), self._offloader_ready()
        moved = offloader.offload() if offloader is not None else 0
        # Peaks left running: the colocated turns read this phase's after it (memory_use)
        return {
            **self.memory_use(reset_peaks=False),
            "bytes": float(moved),
            "seconds": time.perf_counter() - started,
        }

    def onload(self) -> dict[str, float]:
        started, offloader = time.perf_counter(), self._offloader_ready()
        moved = offloader.onload() if offloader is not None else 0
        return {
            **self.memory_use(reset_peaks=False),
            "bytes": float(moved),
            "seconds": time.perf_counter() - started,
        }

    def memory_use(self, reset_peaks: bool = True) -> dict[str, float]:
        """GPU GB allocated and reserved now, and the peak reserved since the peaks were last reset;
        host GB (``host_memory``): this rank's RSS and its peak likewise, and the container's (or
        node's) used and limit. ``reset_peaks``: start new peaks (the colocated turns read this after
        every phase, so each phase gets its own)."""
        host = read_host_memory(reset_peak=reset_peaks)
        host_metrics = host.as_metrics() if host is not None else {}
        if self.device.type != "cuda":
            return {"allocated_gb": 0.0, "reserved_gb": 0.0, "peak_reserved_gb": 0.0, **host_metrics}
        out = {
            **host_metrics,
            "allocated_gb": torch.cuda.memory_allocated(self.device) / 1e9,
            "reserved_gb": torch.cuda.memory_reserved(self.device) / 1e9,
            "peak_reserved_gb": torch.cuda.max_memory_reserved(self.device) / 1e9,
        }
        if reset_peaks:
            torch.cuda.reset_peak_memory_stats(self.device)
        return out

    def weights_resident(self) -> contextlib.AbstractContextManager[Any]:
        """The weights on the GPU for an export while the rest may stay off."""
        offloader = self._offloader
        return offloader.resident("weights") if offloader is not None else contextlib.nullcontext()

    def _require_resident(self, what: str) -> None:
        """Training or checkpointing an offloaded rank would read freed memory: a driver bug."""
        offloader = self._offloader
        if offloader is not None and any(offloader.is_offloaded(g) for g in offloader.groups):
            raise RuntimeError(f"{what} on a trainer rank whose state is offloaded: onload() first")
