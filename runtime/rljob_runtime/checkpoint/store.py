"""Where checkpoints live, how one is saved atomically, and which one is the latest.

Layout under <checkpoint.path>:

- ``iter_<step:07d>/``: one complete checkpoint: the trainer's files (``model/`` as a Hugging Face
  directory; the torch backend: one ``trainer_rank<r>.pt`` per rank; the megatron backend: ``dist/``,
  a Megatron torch_dist checkpoint any layout resumes from), ``driver.json`` (step, data-source position,
  driver RNG, partial-rollout buffer) and the empty marker file ``complete``. Only directories with
  the marker count (``completed_steps``, ``latest``).
- ``.staging-iter_<step:07d>/``: a save in progress (``save``).
- ``.trash-iter_<step:07d>-<tag>/``: an older checkpoint of the same step being replaced (``save``).

``save`` is atomic: everything (the marker last) is written into the staging directory, every file
and directory there is fsynced, and only then is the staging directory renamed to ``iter_<step>``
(one rename on the same filesystem). A crash at any point leaves either the previous set of
checkpoints or the new one, never a partial ``iter_<step>`` with a marker: what is left over
(staging, trash, marker-less ``iter_*``) is ignored by ``latest`` and removed by ``clean``, which
the driver calls before resuming. A failed write (disk full, quota, I/O error, a trainer rank that
could not write) removes the staging directory and raises ``CheckpointWriteError``; the previous
checkpoints are untouched. ``prune`` deletes a checkpoint's marker before its files, so a half-deleted
directory is never complete.

Durability is best effort where the filesystem refuses fsync (some refuse it on directories); the
atomicity does not depend on it, only whether the newest save survives a power loss.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CheckpointWriteError

log = logging.getLogger("rljob.checkpoint")

_ITER = re.compile(r"^iter_(\d{7})$")
_TRASH = re.compile(r"^\.trash-(iter_\d{7})-")
COMPLETE = "complete"
DRIVER_STATE = "driver.json"
MODEL_DIR = "model"  # the policy as a Hugging Face directory (what engines of a resumed run load)
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"

# fsync errors that say "not supported here", not "your data is lost": skipped (best effort).
_FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF})
# What torch.save's C++ zip writer raises (as RuntimeError) when the file cannot be written: e.g.
# "[enforce fail at inline_container.cc:...] . unexpected pos 704 vs 598" (EFBIG, ENOSPC),
# "basic_ios::clear: iostream error", "PytorchStreamWriter failed writing file data/0: file write
# failed", "File ... cannot be opened.", "Parent directory ... does not exist."
_TORCH_WRITE_FAILURES = (
    "inline_container",
    "PytorchStreamWriter",
    "iostream error",
    "file write failed",
    "cannot be opened",
    "Parent directory",
)


def model_dir(directory: str | Path) -> Path:
    """The HF export inside one iteration's directory."""
    return Path(directory) / MODEL_DIR


def iteration_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def staging_dir(root: str | Path, step: int) -> Path:
    """Where ``save`` writes step ``step`` before renaming it to ``iteration_dir``."""
    return Path(root) / f"{STAGING_PREFIX}iter_{step:07d}"


def completed_steps(root: str | Path) -> list[int]:
    """Steps with a complete checkpoint under `root`, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _ITER.match(child.name)
        if match and (child / COMPLETE).exists():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest(root: str | Path) -> tuple[int, Path] | None:
    steps = completed_steps(root)
    return (steps[-1], iteration_dir(root, steps[-1])) if steps else None


def write_driver_state(directory: Path, state: dict[str, Any]) -> None:
    (directory / DRIVER_STATE).write_text(json.dumps(state, indent=1, sort_keys=True))


def read_driver_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / DRIVER_STATE).read_text())


def mark_complete(directory: Path) -> None:
    (directory / COMPLETE).write_text("")


def is_write_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a checkpoint file could not be written (disk full, quota, I/O error, file
    too large), as opposed to a bug: every OSError, safetensors' SafetensorError and torch.save's
    writer RuntimeErrors (recognised by their messages, see ``_TORCH_WRITE_FAILURES``)."""
    exc = _remote_cause(exc)
    if isinstance(exc, OSError):
        return True
    # safetensors raises SafetensorError("Error while serializing: I/O error: ...") from Rust;
    # matched by name so this module does not import safetensors.
    if type(exc).__name__ == "SafetensorError":
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _TORCH_WRITE_FAILURES)


def save(root: str | Path, step: int, write: Callable[[Path], None], *, keep: int) -> Path:
    """Save step ``step`` atomically: ``write(staging)`` writes the trainer's files and driver.json into
    a fresh staging directory, then the marker is written, everything fsynced and the directory
    renamed to ``iter_<step>`` (an existing one of the same step is replaced: moved aside first,
    deleted after). Then all but the newest ``keep`` checkpoints are pruned (0 keeps all).

    Returns the final directory. A write failure (see ``is_write_failure``) anywhere before the
    rename raises ``CheckpointWriteError`` naming the step, the path and the cause; the staging
    directory is removed and the previous checkpoints are kept. Any other exception (a bug) also
    removes the staging directory and propagates unchanged."""
    root = Path(root)
    final = iteration_dir(root, step)
    staging = staging_dir(root, step)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_tree(staging)  # a stale one of an interrupted save of the same step
        staging.mkdir()
        write(staging)
        mark_complete(staging)
        _fsync_tree(staging)
        _install(staging, final)
    except BaseException as exc:
        leftover = _discard(staging)
        if isinstance(exc, Exception) and is_write_failure(exc):
            raise _write_error(root, step, final, exc, leftover) from exc
        raise
    prune(root, keep)
    return final


def clean(root: str | Path) -> list[Path]:
    """Remove what interrupted saves and prunes left under ``root`` (staging and trash directories,
    ``iter_*`` directories without the marker) and return the removed paths. A complete trash
    directory whose ``iter_<step>`` is missing (a crash between the two renames of a replacing
    ``save``) is renamed back instead: it is still a complete checkpoint. Call it only while no save
    runs (the driver calls it before resuming)."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed: list[Path] = []
    for child in sorted(root.iterdir()):
        name = child.name
        if not child.is_dir() or child.is_symlink():
            continue
        trash = _TRASH.match(name)
        if trash and (child / COMPLETE).exists() and not os.path.lexists(root / trash.group(1)):
            os.rename(child, root / trash.group(1))
            _fsync_dir(root, strict=False)
            log.warning(
                "restored %s from %s (a replacing save was interrupted)", root / trash.group(1), child
            )
            continue
        if name.startswith((STAGING_PREFIX, TRASH_PREFIX)) or (
            _ITER.match(name) and not (child / COMPLETE).exists()
        ):
            _remove_tree(child)
            removed.append(child)
    if removed:
        log.info("removed leftovers of interrupted checkpoint saves: %s", [str(p) for p in removed])
    return removed


def prune(root: str | Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` complete checkpoints (0 keeps all); returns the deleted steps.
    Each one's marker goes first, so a crash mid-delete leaves an incomplete directory (``clean``
    removes it), never a complete-looking partial one. I/O errors are logged, not raised: the save
    that called it has succeeded."""
    try:
        steps = completed_steps(root)
    except OSError as exc:
        log.warning("could not list checkpoints under %s to prune them: %s", root, exc)
        return []
    doomed = steps[:-keep] if keep and len(steps) > keep else []
    deleted = []
    for step in doomed:
        directory = iteration_dir(root, step)
        try:
            _remove_tree(directory)
        except OSError as exc:
            log.warning("could not delete old checkpoint %s: %s", directory, exc)
            continue
        deleted.append(step)
    return deleted


# ------------------------------------------------------------------ helpers


def _install(staging: Path, final: Path) -> None:
    """Rename the complete ``staging`` to ``final``, replacing an existing ``final`` via a trash name
    (rename refuses a non-empty target; deleting it first would leave no checkpoint of the step)."""
    root = final.parent
    if not os.path.lexists(final):
        os.rename(staging, final)
    else:
        trash = root / f"{TRASH_PREFIX}{final.name}-{os.getpid()}-{time.time_ns()}"
        os.rename(final, trash)
        try:
            os.rename(staging, final)
        except BaseException:
            os.rename(trash, final)  # put the old checkpoint back
            raise
        _fsync_dir(root, strict=False)  # the new one is in place before the old one goes
        try:
            _remove_tree(trash)
        except OSError as exc:  # the save has succeeded; clean() removes the rest
            log.warning("could not delete the replaced checkpoint %s: %s", trash, exc)
    # Best effort: if this rename is lost in a power cut, the staging dir is left (clean removes it)
    # and the previous checkpoint is the latest: still consistent.
    _fsync_dir(root, strict=False)


def _remove_tree(path: Path) -> None:
    """Delete a checkpoint-like directory: its marker first (made durable), then the rest."""
    if not os.path.lexists(path):
        return
    marker = path / COMPLETE
    if os.path.lexists(marker):
        marker.unlink()
        _fsync_dir(path, strict=False)
    shutil.rmtree(path, ignore_errors=True)


def _discard(staging: Path) -> bool:
    """Remove a failed save's staging directory; True when some of it is left (clean removes it)."""
    with contextlib.suppress(OSError):
        _remove_tree(staging)
    return os.path.lexists(staging)


def _remote_cause(exc: BaseException) -> BaseException:
    """The error a Ray actor raised: ray.get re-raises it as RayTaskError(<its class>), whose str() is
    the whole remote traceback and whose attributes (errno) are not copied; `.cause` is the original."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _write_error(
    root: Path, step: int, final: Path, cause: BaseException, leftover: bool
) -> CheckpointWriteError:
    cause = _remote_cause(cause)
    try:
        found = latest(root)
    except OSError:  # the disk may be failing: say what we can
        found = None
    kept = f"the previous checkpoint (step {found[0]}) is kept" if found else "there is no earlier checkpoint"
    message = f"checkpoint of step {step} not saved to {final}: {cause}; {kept}"
    if leftover:
        message += f"; {staging_dir(root, step)} could not be removed (clean() removes it)"
    error = CheckpointWriteError(message)
    # Keep the errno (ENOSPC, EDQUOT, EIO...) for callers that branch on it. Not strerror or
    # filename: OSError.__str__ would then print those instead of `message`.
    if isinstance(cause, OSError):
        error.errno = cause.errno
    return error


def _fsync_tree(top: Path) -> None:
    """fsync every file, then every directory bottom-up, so the rename publishes durable contents."""
    # Bottom-up: each subdirectory has been fsynced (as dirpath) before its parent.
    for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                _fsync_path(path, os.O_RDONLY, strict=True)
        _fsync_dir(Path(dirpath), strict=True)


def _fsync_dir(path: Path, *, strict: bool) -> None:
    _fsync_path(str(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0), strict=strict)


def _fsync_path(path: str, flags: int, *, strict: bool) -> None:
    """fsync one path; filesystems that refuse fsync are skipped, real I/O errors raise if ``strict``
    (an NFS server reports ENOSPC/EDQUOT of delayed writes only here)."""
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if strict and exc.errno not in _FSYNC_UNSUPPORTED:
            raise
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if strict and exc.errno not in _FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)
