"""Host memory readings (host_memory.py) and how the colocated turns record them after each phase
(colocation.Turns.memory, after_save): the figures that say whether a colocated run's host side
stays under its pod's memory."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rljob_runtime import host_memory
from rljob_runtime.colocation import Turns
from rljob_runtime.host_memory import (
    container_limit,
    parse_cgroup_limit,
    parse_meminfo,
    parse_status_kb,
    read_host_memory,
)

STATUS = "Name:\tpython3\nVmPeak:\t 9000 kB\nVmHWM:\t  5120 kB\nVmRSS:\t  4096 kB\nThreads:\t3\n"
MEMINFO = "MemTotal:       131072000 kB\nMemFree:        1000 kB\nMemAvailable:   100000000 kB\n"


def test_status_fields_are_read_in_bytes() -> None:
    assert parse_status_kb(STATUS, "VmRSS") == 4096 * 1024
    assert parse_status_kb(STATUS, "VmHWM") == 5120 * 1024
    assert parse_status_kb(STATUS, "VmSwap") is None  # absent
    assert parse_status_kb("VmRSS:\tlots\n", "VmRSS") is None


def test_node_used_memory_is_total_less_available() -> None:
    assert parse_meminfo(MEMINFO) == ((131072000 - 100000000) * 1024, 131072000 * 1024)
    assert parse_meminfo("MemTotal: 5 kB\n") is None  # a kernel without MemAvailable


@pytest.mark.parametrize(
    ("usage", "limit", "expected"),
    [
        ("2000\n", "8000\n", (2000, 8000)),
        ("2000\n", "max\n", None),  # cgroup v2 without a limit
        ("2000\n", str(2**63 - 4096), None),  # cgroup v1's "unlimited"
        ("", "8000", None),
    ],
)
def test_a_cgroup_counts_only_with_a_limit(usage: str, limit: str, expected: tuple[int, int] | None) -> None:
    assert parse_cgroup_limit(usage, limit) == expected


def test_the_container_limit_is_read_from_cgroup_v2_then_v1(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir(), v1.mkdir()
    assert container_limit(v2, v1) is None  # neither exposes memory files
    (v1 / "memory.usage_in_bytes").write_text("300\n")
    (v1 / "memory.limit_in_bytes").write_text("1000\n")
    assert container_limit(v2, v1) == (300, 1000)
    (v2 / "memory.current").write_text("500\n")
    (v2 / "memory.max").write_text("4000\n")
    assert container_limit(v2, v1) == (500, 4000)
    (v2 / "memory.max").write_text("max\n")
    assert container_limit(v2, v1) is None  # v2 present and unlimited: the node's memory counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_this_process_peak_grows_with_an_allocation_and_restarts_after_a_reset() -> None:
    first = read_host_memory()
    assert first is not None and first.rss_gb > 0 and first.limit_gb >= first.used_gb > 0
    block = bytearray(200 * 2**20)  # 200 MiB, touched page by page
    for i in range(0, len(block), 4096):
        block[i] = 1
    during = read_host_memory()
    del block
    kept = read_host_memory(reset_peak=False)  # the peak restarted at `during`, with the block held
    still = read_host_memory()  # ... and the read above left it running
    after = read_host_memory()  # a new peak, started after the block was freed
    assert during is not None and kept is not None and still is not None and after is not None
    assert during.peak_rss_gb >= first.rss_gb + 0.19
    if host_memory.reset_peak_rss():  # the kernel lets the peak restart: the new one lacks the block
        assert still.peak_rss_gb > during.peak_rss_gb - 0.05
        assert after.peak_rss_gb < during.peak_rss_gb - 0.15
    assert set(during.as_metrics()) == {"host_rss_gb", "host_peak_rss_gb", "host_used_gb", "host_limit_gb"}


class Ranks:
    """A trainer group whose ranks report fixed memory."""

    def __init__(self, ranks: list[dict[str, float]]) -> None:
        self.ranks = ranks

    def memory_use(self) -> list[dict[str, float]]:
        return self.ranks


class Engines:
    def engine_gpu_memory_gb(self) -> list[float]:
        return [10.0, 12.5]


def rank(gpu: float, rss: float, peak: float, used: float, limit: float) -> dict[str, float]:
    return {
        "reserved_gb": gpu,
        "peak_reserved_gb": gpu + 1,
        "host_rss_gb": rss,
        "host_peak_rss_gb": peak,
        "host_used_gb": used,
        "host_limit_gb": limit,
    }


def turns(ranks: list[dict[str, float]], device: str = "cuda") -> Turns:
    spec: Any = SimpleNamespace(resources=SimpleNamespace(colocate=True, device=device))
    return Turns(spec, Ranks(ranks), Engines())  # type: ignore[arg-type]


def test_each_phase_records_gpu_and_host_memory_of_both_sides() -> None:
    # Two ranks on two nodes: the second node is the fuller one for its limit (90 of 100 GB).
    t = turns([rank(20.0, 30.0, 45.0, 60.0, 128.0), rank(22.0, 31.0, 50.0, 90.0, 100.0)])
    assert t.memory("train") == {
        "memory/train/trainer_gb": 42.0,
        "memory/train/trainer_peak_gb": 23.0,
        "memory/train/engines_gb": 22.5,
        "memory/train/trainer_host_rss_gb": 61.0,
        "memory/train/trainer_host_peak_rss_gb": 50.0,
        "memory/train/host_used_gb": 90.0,
        "memory/train/host_limit_gb": 100.0,
    }


def test_ranks_without_host_figures_record_the_gpu_only() -> None:
    metrics = turns([{"reserved_gb": 1.0, "peak_reserved_gb": 2.0}]).memory("sync")
    assert set(metrics) == {"memory/sync/trainer_gb", "memory/sync/trainer_peak_gb", "memory/sync/engines_gb"}


def test_the_save_is_recorded_as_a_phase_only_when_the_trainer_takes_turns() -> None:
    assert turns([rank(1, 2, 3, 4, 5)]).after_save()["memory/save/trainer_host_peak_rss_gb"] == 3
    assert turns([rank(1, 2, 3, 4, 5)], device="cpu").after_save() == {}  # the CPU demo: no turns
