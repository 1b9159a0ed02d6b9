"""The cache directory primitives the model modules share: where the local cache is, what counts as a
complete model directory, the cross-process file lock and where it lies, and building a directory
so that no process ever sees it half-built.

The lowest floor of the package: it imports none of the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def cache_root() -> Path:
    """``$RLJOB_CACHE`` or ``~/.cache/rljob``."""
    return Path(os.environ.get("RLJOB_CACHE") or Path.home() / ".cache" / "rljob").expanduser()


def is_hf_dir(path: Path) -> bool:
    """A Hugging Face model directory: one with a config.json."""
    return path.is_dir() and (path / "config.json").is_file()


@contextlib.contextmanager
def file_lock(path: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive lock on the file ``path`` across processes; ``on_wait`` runs once if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lock_path(directory: Path) -> Path:
    """The lock beside a directory (not inside: the directory is renamed into place)."""
    return directory.parent / f".{directory.name}.lock"


def build_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp_dir)`` and rename the result to ``target`` (no half-built directory is ever seen).

    A lock beside ``target`` makes concurrent processes build it only once.
    """
    with file_lock(lock_path(target)):
        if is_hf_dir(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it 0700
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
