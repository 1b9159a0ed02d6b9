"""Host memory of a process and of the memory it may use (its container's cgroup, else the node).

A colocated trainer rank moves its state between the GPU and pinned host memory every step, and a
checkpoint save stages that state on the host too: the host side is what the pod's memory limit
(and Ray's memory monitor, which reads the node's used memory) can kill. The colocated turns record
these after every phase (``colocation.Turns.memory``).

    process: resident set now, and its peak since the last reset (``VmHWM``, reset by writing 5 to
             /proc/self/clear_refs, Linux 4.0+), so each phase gets its own peak
    limit:   the cgroup v2 (or v1) container's usage and limit when it has one; else the node's
             used (MemTotal - MemAvailable, what Ray's memory monitor reads) and total

The parsers are pure; the readers return None for what the system does not expose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GB = 1e9
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
# A cgroup v1 "no limit" is a huge page-aligned number, not "max".
V1_UNLIMITED = 2**60


@dataclass(frozen=True)
class HostMemory:
    rss_gb: float
    peak_rss_gb: float  # since the previous reset
    used_gb: float  # the container's usage, or the node's used memory
    limit_gb: float  # the container's limit, or the node's total

    def as_metrics(self) -> dict[str, float]:
        return {
            "host_rss_gb": self.rss_gb,
            "host_peak_rss_gb": self.peak_rss_gb,
            "host_used_gb": self.used_gb,
            "host_limit_gb": self.limit_gb,
        }


def parse_status_kb(text: str, key: str) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM), in bytes."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024
    return None


def parse_meminfo(text: str) -> tuple[int, int] | None:
    """(used, total) bytes from /proc/meminfo: used is MemTotal - MemAvailable."""
    total = parse_status_kb(text, "MemTotal")
    available = parse_status_kb(text, "MemAvailable")
    if total is None or available is None:
        return None
    return total - available, total


def parse_cgroup_limit(usage: str, limit: str) -> tuple[int, int] | None:
    """(usage, limit) bytes from a cgroup's memory files; None when it sets no limit."""
    limit = limit.strip()
    if limit == "max" or not limit.isdigit() or not usage.strip().isdigit():
        return None
    if int(limit) >= V1_UNLIMITED:
        return None
    return int(usage.strip()), int(limit)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def container_limit(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1) -> tuple[int, int] | None:
    """(usage, limit) of this process's memory cgroup when it has a limit (a pod with
    ``resources.limits.memory``); None otherwise."""
    for usage_file, limit_file in (
        (v2 / "memory.current", v2 / "memory.max"),
        (v1 / "memory.usage_in_bytes", v1 / "memory.limit_in_bytes"),
    ):
        usage, limit = _read(usage_file), _read(limit_file)
        if usage is not None and limit is not None:
            return parse_cgroup_limit(usage, limit)
    return None


def reset_peak_rss() -> bool:
    """Start a new ``VmHWM`` peak for this process; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def read_host_memory(reset_peak: bool = True) -> HostMemory | None:
    """This process's RSS and peak RSS (then a new peak starts), and its container's or node's
    used and limit memory; None where /proc is not there (not Linux)."""
    status, meminfo = _read(Path("/proc/self/status")), _read(Path("/proc/meminfo"))
    if status is None or meminfo is None:
        return None
    rss = parse_status_kb(status, "VmRSS") or 0
    peak = parse_status_kb(status, "VmHWM") or rss
    if reset_peak:
        reset_peak_rss()
    used, limit = container_limit() or parse_meminfo(meminfo) or (0, 0)
    return HostMemory(rss / GB, max(peak, rss) / GB, used / GB, limit / GB)
