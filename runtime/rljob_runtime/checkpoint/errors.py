"""Errors of checkpoint saving and loading that the driver handles by kind."""

from __future__ import annotations


class CheckpointWriteError(OSError):
    """A save failed (disk full, quota, I/O error, a rank that could not write): nothing of it is
    left where resume looks, the previous checkpoint is intact. Every trainer rank raises it when
    any rank failed, so no rank waits for the others in a collective."""
