"""An xdist scheduler that runs one test module on a worker of its own, beside all the other tests
in order on the other worker: for `pytest -n 2` where that module is long and keeps about one core
busy (the `make demo` e2e test), and the rest must not run side by side with each other (they share
one cluster). Not used for the integration tests: beside the learning proof, a test that counts
rollouts made ahead of the trainer failed (its timing assumes the machine to itself).

A scheduler of our own because `--dist loadgroup` groups nothing under pytest 9: xdist 3.8 marks a
group by setting `_nodeid`, which pytest 9 no longer reads."""

from __future__ import annotations

from typing import Any

import pytest


def scheduler(config: pytest.Config, log: Any, module: str) -> Any:
    """For a conftest's `pytest_xdist_make_scheduler`: `module` (a file name) apart, the rest together."""
    from xdist.scheduler import LoadScopeScheduling

    class OneModuleApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "apart" if f"{module}::" in nodeid else "together"

    return OneModuleApart(config, log)
