"""Exact per-tensor checksums, to show that an engine's weights equal the trainer's after a sync.

Each tensor's bit patterns (read as integers of its element size) are summed twice, plainly and
weighted by position (mod 65521), in int64 on the tensor's device: equal only if the values agree,
bit for bit and in order, up to a collision no test will meet. Computed where the tensor lives (a
GPU sums 8 GB in milliseconds), so only two integers per tensor travel.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@torch.no_grad()
def tensor_checksum(tensor: torch.Tensor) -> tuple[int, int]:
    bits = tensor.detach().contiguous().view(_INTS[tensor.element_size()]).reshape(-1).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
    return int(bits.sum()), int((bits * weights).sum())


def checksums(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[int, int]]:
    """{name: (sum, position-weighted sum)} of each tensor's bit patterns."""
    return {name: tensor_checksum(t) for name, t in named}
