"""Torch threads of a job's CPU processes: the node's usable cores (affinity, capped by the cgroup's
CPU limit) divided among the processes that share them (runtime/rljob_runtime/cpu_threads.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rljob_runtime.cpu_threads import (
    cfs_quota_cpus,
    cgroup_cpu_limit,
    cgroup_paths,
    cpu_max_cpus,
    threads_for,
    usable_cpus,
)
from rljob_runtime.placement import node_shares


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("max 100000", None),
        ("200000 100000", 2),
        ("150000 100000", 1),
        ("50000 100000", 1),
        ("800000 100000\n", 8),
    ],
)
def test_cgroup_v2_cpu_max_in_whole_cpus(text: str, cpus: int | None) -> None:
    assert cpu_max_cpus(text) == cpus


def test_cgroup_v1_quota_in_whole_cpus() -> None:
    assert cfs_quota_cpus("-1\n", "100000\n") is None
    assert cfs_quota_cpus("400000\n", "100000\n") == 4
    assert cfs_quota_cpus("250000", "100000") == 2  # 2.5 CPUs: two threads, not three throttled ones


def test_the_cpu_controllers_paths_are_read_from_proc_self_cgroup() -> None:
    v1 = "4:memory:/pod/a\n3:cpu,cpuacct:/kubepods/pod1/c1\n0::/\n"
    assert cgroup_paths(v1) == ["/kubepods/pod1/c1", "/"]
    assert cgroup_paths("0::/system.slice/x.service\n") == ["/system.slice/x.service"]


def _write(path: Path, **files: str) -> None:
    """cgroup files by keyword: cpu_max is cpu.max, cfs_quota_us is cpu.cfs_quota_us."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("cpu_max", "cpu.max").replace("cfs_", "cpu.cfs_")).write_text(text)


def test_a_v2_limit_on_the_container_or_a_parent_binds(tmp_path: Path) -> None:
    _write(tmp_path, cpu_max="max 100000")
    _write(tmp_path / "kubepods" / "pod1", cpu_max="300000 100000")  # the pod's limit
    _write(tmp_path / "kubepods" / "pod1" / "c1", cpu_max="max 100000")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1/c1\n") == 3
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None  # no limit anywhere on the path


def test_a_v1_container_sees_its_own_cgroup_at_the_mount(tmp_path: Path) -> None:
    """Inside a container the cpu mount is the container's directory, and /proc/self/cgroup names
    the host's path, which does not exist there: the mount's own quota counts."""
    _write(tmp_path / "cpu,cpuacct", cfs_quota_us="200000\n", cfs_period_us="100000\n")
    assert cgroup_cpu_limit(tmp_path, "3:cpu,cpuacct:/kubepods/pod1/c1\n") == 2


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "absent", "0::/\n") is None


def test_threads_divide_the_cores_among_the_processes_that_share_them() -> None:
    assert threads_for(1, cpus=2) == 2  # the CPU demo: one colocated slot on a 2-core node
    assert threads_for(2, cpus=2) == 1  # two ranks on two cores
    assert threads_for(4, cpus=2) == 1  # never fewer than one
    assert threads_for(3, cpus=16) == 5
    assert 1 <= threads_for(1) == usable_cpus()


def test_each_bundle_shares_its_node_with_the_jobs_other_bundles_there() -> None:
    assert node_shares(("w1",), 1) == [1]
    assert node_shares(("w1", "w1", "w2"), 3) == [2, 2, 1]
    # a node Ray did not name: shared with every bundle (fewer threads, never too many)
    assert node_shares(("w1", ""), 2) == [1, 2]
    assert node_shares((), 2) == [2, 2]


def test_a_cpu_engine_takes_its_part_of_the_cores(tmp_path: Path) -> None:
    from rljob_runtime.rollout.engine_actor import EngineProcess

    def threads(**kwargs: object) -> int | None:
        return EngineProcess(kind="hf", model_path=str(tmp_path), log_dir=str(tmp_path), **kwargs).threads  # type: ignore[arg-type]

    assert threads(device="cpu", cpu_share=1) == usable_cpus()
    assert threads(device="cpu", cpu_share=10_000) == 1
    assert threads(device="cpu", threads=3) == 3  # an explicit count wins
    assert threads(device="cuda") is None  # SGLang's own choice on GPUs
