"""rollout.customFilter functions the tests name by import path
(``group_filters:keep_all_after_a_pause``)."""

from __future__ import annotations

import asyncio

from rljob_runtime.data.sample import Sample


async def keep_all_after_a_pause(samples: list[Sample]) -> bool:
    """Over-sampling without filtering (every group passes), answered 0.1 s late: the step's abort
    then lands while the next requests decode. The hf engine decodes in lockstep batches, so without
    the pause the abort races the next batch's prefill and may find no tokens to carry."""
    await asyncio.sleep(0.1)
    return True
