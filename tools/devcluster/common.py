"""Shared by every devcluster module: constants, cache paths, logging and the error type."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent

LOOPBACK = "127.0.0.1"
RAY_DASHBOARD_PORT_IN_CLUSTER = 8265
MARKER_ENV = "RLJOB_DEVCLUSTER_DIR"


class HarnessError(Exception):
    """A component failed; carries which one and where its log is."""

    def __init__(self, component: str, message: str, log: Path | None = None) -> None:
        super().__init__(f"{component}: {message}")
        self.component = component
        self.message = message
        self.log = log

    def report(self) -> str:
        lines = [f"devcluster: {self.component} failed: {self.message}"]
        if self.log is not None:
            lines.append(f"  log: {self.log}")
            tail = read_tail(self.log, 25)
            if tail:
                lines.append("  --- last lines of the log ---")
                lines.extend("  " + line for line in tail)
        return "\n".join(lines)


def read_tail(path: Path, n: int) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            return f.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def log(msg: str) -> None:
    print(f"[devcluster] {msg}", flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("RLJOB_CACHE") or Path.home() / ".cache" / "rljob").expanduser()


def cluster_dir(name: str) -> Path:
    return cache_root() / "clusters" / name
