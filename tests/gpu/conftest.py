"""GPU tests: everything under tests/gpu/ is marked `gpu` and skipped where no CUDA device is
present (CI); run them on a GPU machine with `make test-gpu`."""

from __future__ import annotations

import pytest
from verdicts import record, verdict_line


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not has_gpu:
                item.add_marker(
                    pytest.mark.skip(reason="needs an NVIDIA GPU (make test-gpu on a GPU machine)")
                )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each GPU test's verdict as it ends (verdicts.py): a run cut at its limit still tells."""
    line = verdict_line(report)
    if line is not None:
        record(line)
