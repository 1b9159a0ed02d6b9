"""The one error that stops a run with a reason of its own: raised by ``prepare`` (a job this
runtime refuses), by the run state (a required checkpoint that is not there) and by the loop (the
trainer restarts used up). The command turns it into the one-line reason the operator shows."""

from __future__ import annotations


class RunError(RuntimeError):
    """The run cannot go on; the message is the one-line reason the operator shows."""
