"""Token-budget micro-batches (``training.dynamicBatch``): which rows of one optimizer step share a
packed forward/backward pass.

Pure and deterministic: the same lengths and budget give the same plan on every rank of a model
replica (its TP / PP peers must run the same micro-batches) and in both passes of a step (``logprobs``
and ``train`` use one plan, so a first on-policy step stays bit-for-bit on-policy).

The plan uses the fewest micro-batches it can fit and spreads the tokens evenly over them: for k
micro-batches (from ceil(total / budget) up), longest-first into the least-loaded one (LPT); the
first k whose every micro-batch fits the budget wins. Balanced micro-batches matter because one
pass costs about its token count: a lopsided split pays for its largest part (slime balances its
dynamic micro-batches the same way, Karmarkar-Karp there; LPT is within 4/3 of optimal and simpler).
A row longer than the budget cannot be split (its tokens attend to each other) and is not
truncated: it goes alone into a micro-batch of its own (admission refuses such budgets where the
spec bounds prompt and response lengths; see rljob_api.spec_training.DynamicBatchSpec).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Micro-batches of the rows with token counts ``lengths``: lists of row indices (ascending
    inside a micro-batch; micro-batches ordered by their first row), each of at most ``max_tokens``
    tokens unless it is one row longer than that. Every row appears exactly once."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if any(n < 0 for n in lengths):
        raise ValueError(f"negative length in {list(lengths)}")
    oversize = [i for i, n in enumerate(lengths) if n > max_tokens]
    rest = [i for i, n in enumerate(lengths) if n <= max_tokens]
    bins: list[list[int]] = [[i] for i in oversize]
    if rest:
        total = sum(lengths[i] for i in rest)
        k = max(1, -(-total // max_tokens))
        while True:  # ends by k == len(rest) at the latest: one row per bin always fits
            packed = _lpt(rest, lengths, k, max_tokens)
            if packed is not None:
                bins.extend(packed)
                break
            k += 1
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def _lpt(rows: list[int], lengths: Sequence[int], k: int, max_tokens: int) -> list[list[int]] | None:
    """``rows`` into k bins, longest first into the least-loaded bin (ties: the lower bin, then the
    lower row, so the plan is deterministic); None when a bin passes ``max_tokens``."""
    order = sorted(rows, key=lambda i: (-lengths[i], i))
    heap = [(0, b) for b in range(k)]  # (tokens, bin)
    bins: list[list[int]] = [[] for _ in range(k)]
    for i in order:
        load, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (load + lengths[i], b))
    if max(load for load, _ in heap) > max_tokens:
        return None
    return [b for b in bins if b]
