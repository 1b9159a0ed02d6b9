"""A one-rank megatron-core world on CPU for unit tests: gloo, and the CUDA calls megatron-core makes
regardless (current device, the TP RNG tracker, recompute's RNG save/restore) pointed at the CPU."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist


@contextlib.contextmanager
def cpu_megatron_patches() -> Iterator[None]:
    """megatron-core's CUDA calls pointed at the CPU, in a process whose gloo group is up."""
    from megatron.core.tensor_parallel import random as mp_random

    mp = pytest.MonkeyPatch()
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")  # rotary cache device
    mp.setattr(mp_random.get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    # Activation recompute saves and restores the CUDA RNG state around each checkpointed region.
    mp.setattr(mp_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    mp.setattr(mp_random, "_set_cuda_rng_state", lambda *a, **k: None)
    try:
        yield
    finally:
        mp.undo()


@contextlib.contextmanager
def cpu_megatron_world() -> Iterator[None]:
    if torch.cuda.is_available():
        pytest.skip("CPU-only test (tests/gpu covers CUDA)")
    from megatron.core import parallel_state

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with cpu_megatron_patches():
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
