"""rollout.customFilter functions the tests name by import path (``group_filters:keep_all``)."""

from __future__ import annotations

from rljob_runtime.data.sample import Sample


def keep_all(samples: list[Sample]) -> bool:
    """Over-sampling without filtering: every group passes."""
    return True
