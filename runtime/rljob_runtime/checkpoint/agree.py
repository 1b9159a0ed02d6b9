"""Trainer ranks agree on whether their part of a checkpoint was written, so that no rank waits forever.

Every rank of a trainer writes its own files of a checkpoint and then meets the others in a collective.
When one rank's write raises and it skips the collective, the others wait in it until the process
group's timeout (or forever). ``write_agreed`` catches the write's error, takes part in one
collective that tells every rank which ranks failed (it also serves as the barrier after the save),
and then every rank raises when any failed: the failing rank its own cause, the others
``CheckpointWriteError("rank r failed to write checkpoint files ...")``.

Used by the torch backend's ``TorchTrainerRank.save`` and the megatron backend's save::

    write_agreed(write, dist_failures(device=torch.device("cuda", torch.cuda.current_device())), rank=rank)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .errors import CheckpointWriteError
from .store import is_write_failure

# One collective: given this rank's "my write failed", the ranks (global) whose write failed.
FailedRanks = Callable[[bool], Sequence[int]]


def write_agreed(write: Callable[[], None], failed_ranks: FailedRanks, *, rank: int) -> None:
    """Run this rank's ``write()``, then ``failed_ranks`` (a collective every rank must reach: it runs
    whatever ``write`` raised), then raise on every rank if any rank failed.

    The failing rank raises ``CheckpointWriteError("rank <rank> failed to write its checkpoint files:
    <cause>")`` (with the cause's errno) when the cause is a write failure (``store.is_write_failure``:
    OSError, safetensors' and torch.save's write errors), or the cause itself when it is something
    else (a bug shows as itself). Every other rank raises ``CheckpointWriteError("rank <r> failed to
    write checkpoint files (rank <rank> wrote its own)")`` ("ranks 1, 3 ..." when several failed).
    Returns when every rank succeeded."""
    error: Exception | None = None
    try:
        write()
    except Exception as exc:  # caught so this rank still reaches the collective below
        error = exc
    try:
        failed = sorted(failed_ranks(error is not None))
    except Exception:
        if error is None:
            raise
        # The group is broken too; our own failure is the news (the collective's is its __context__).
        raise _own_error(error, rank) from error
    if error is not None:
        raise _own_error(error, rank) from error
    if failed:
        who = f"rank {failed[0]}" if len(failed) == 1 else "ranks " + ", ".join(map(str, failed))
        raise CheckpointWriteError(f"{who} failed to write checkpoint files (rank {rank} wrote its own)")


def _own_error(error: Exception, rank: int) -> Exception:
    if not is_write_failure(error):
        return error
    own = CheckpointWriteError(f"rank {rank} failed to write its checkpoint files: {error}")
    if isinstance(error, OSError):  # keep ENOSPC/EDQUOT/EIO (only errno: strerror would change str())
        own.errno = error.errno
    return own


def failures_by_all_reduce(
    all_reduce: Callable[[torch.Tensor], torch.Tensor], rank: int, world_size: int
) -> Callable[[bool], list[int]]:
    """``failed_ranks`` from a SUM all-reduce of one flag per rank (this rank sets its own slot)."""

    def failed(mine: bool) -> list[int]:
        flags = torch.zeros(world_size, dtype=torch.int32)
        flags[rank] = int(mine)
        return [r for r, flag in enumerate(all_reduce(flags).tolist()) if flag]

    return failed


def dist_failures(device: torch.device | str = "cpu", group: Any = None) -> Callable[[bool], list[int]]:
    """``failed_ranks`` over a torch.distributed group (the default group: global ranks), the flags
    reduced on ``device`` (a CUDA device for NCCL). Without an initialized group: this process alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return failures_by_all_reduce(lambda flags: flags, 0, 1)

    def all_reduce(flags: torch.Tensor) -> torch.Tensor:
        on_device = flags.to(device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=group)
        return on_device.cpu()

    return failures_by_all_reduce(all_reduce, dist.get_rank(group), dist.get_world_size(group))
