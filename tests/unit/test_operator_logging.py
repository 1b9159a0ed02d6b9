"""The operator's log: kopf's line per handled watch event only with --verbose."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from rljob_operator.__main__ import configure_logging


@pytest.fixture
def restored() -> Iterator[None]:
    logger = logging.getLogger("kopf.objects")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.mark.parametrize(("verbose", "shown"), [(False, False), (True, True)])
def test_kopf_handler_successes_are_logged_only_when_verbose(
    restored: None, verbose: bool, shown: bool
) -> None:
    configure_logging(verbose)
    objects = logging.getLogger("kopf.objects")
    assert objects.isEnabledFor(logging.INFO) is shown
    assert objects.isEnabledFor(logging.WARNING)
