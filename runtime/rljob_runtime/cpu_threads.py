"""How many torch threads a CPU process of a job (a trainer rank, an hf engine) should run.

On device cpu each "GPU" of the spec is one process slot (a Ray bundle). The processes of one node
share its cores: a node with two cores and one colocated slot (the CPU demo) gives its trainer rank
and its engine two threads each (they take turns), a node with two ranks gives each one. One thread
per process whatever the node had left the demo's second core idle: its train phase took 1.7x as long.

The cores are what this process may run on (its CPU affinity) capped by a CPU limit of its cgroup
(a pod's ``resources.limits.cpu``), rounded down, at least one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_max_cpus(text: str) -> int | None:
    """Whole CPUs of a cgroup v2 ``cpu.max`` ("200000 100000" is 2; "max 100000" no limit)."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _whole_cpus(int(fields[0]), int(fields[1]))


def cfs_quota_cpus(quota_text: str, period_text: str) -> int | None:
    """Whole CPUs of a cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: no limit)."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return None if quota < 0 else _whole_cpus(quota, period)


def _whole_cpus(quota: int, period: int) -> int | None:
    if period <= 0:
        return None
    return max(1, quota // period)  # 1500m: one thread, not two throttled ones


def cgroup_paths(proc_self_cgroup: str) -> list[str]:
    """The cgroup paths of this process (``/proc/self/cgroup``): v2's and v1's cpu controller's."""
    paths = []
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[0] == "0" or "cpu" in parts[1].split(",")):
            paths.append(parts[2])
    return paths


def _limits_along(directory: Path, root: Path) -> Iterable[int]:
    """The CPU limits set on ``directory`` and each parent up to ``root`` (a parent's limit binds too)."""
    current = directory
    while True:
        yield from _limit_in(current)
        if current == root or root not in current.parents:
            return
        current = current.parent


def _limit_in(directory: Path) -> Iterable[int]:
    try:
        limit = cpu_max_cpus((directory / "cpu.max").read_text())
    except (OSError, ValueError):
        try:
            limit = cfs_quota_cpus(
                (directory / "cpu.cfs_quota_us").read_text(), (directory / "cpu.cfs_period_us").read_text()
            )
        except (OSError, ValueError):
            return
    if limit is not None:
        yield limit


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_self_cgroup: str | None = None) -> int | None:
    """The tightest CPU limit of this process's cgroups, in whole CPUs; None when none is set.

    Inside a container the cgroup mount is the container's own directory while ``/proc/self/cgroup``
    may name the host's path: both places are read."""
    if proc_self_cgroup is None:
        try:
            proc_self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_self_cgroup = ""
    limits: list[int] = []
    for mount in (root, root / "cpu", root / "cpu,cpuacct"):
        if not mount.is_dir():
            continue
        limits.extend(_limit_in(mount))
        for path in cgroup_paths(proc_self_cgroup):
            directory = mount / path.lstrip("/")
            if directory != mount and directory.is_dir():
                limits.extend(_limits_along(directory, mount))
    return min(limits) if limits else None


def usable_cpus() -> int:
    """The cores this process may use: its affinity, capped by its cgroup's CPU limit."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(cores, limit) if limit is not None else cores)


def threads_for(share: int, cpus: int | None = None) -> int:
    """Threads for one of ``share`` processes that run at once on this node's ``cpus`` cores."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, share))
