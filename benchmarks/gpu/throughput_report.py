"""Pure helpers of the rollout throughput benchmark (``rollout_throughput.py``): the workloads (random
prompt token ids and each request's ``max_new_tokens``, seeded), one result row per mode and
workload, the ratio to stock SGLang, the table, the target line and the JSON document.

Nothing here starts a process or imports torch, Ray or SGLang.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGET = 0.95  # runtime/stock, output tokens per second (the target)
LONG_FRACTION = 0.05  # the long tail: this share of the requests ...
LONG_FACTOR = 8  # ... asks this many times the median's new tokens
LOW_TOKEN = 100  # prompt ids start here (past SmolLM2's special tokens), or at vocab // 2 if smaller


@dataclass(frozen=True)
class Workload:
    """One load: ``new_tokens[i]`` is request i's ``max_new_tokens`` (every request makes exactly that
    many: ``ignore_eos``). Prompts are random token ids, fresh for every timed run (so no run finds its
    prompts in the prefix cache) but the same for every mode: ``prompts(run)`` is seeded by the
    workload's seed, name and run."""

    name: str
    new_tokens: tuple[int, ...]
    prompt_len: int
    vocab: int
    seed: int = 0

    @property
    def requests(self) -> int:
        return len(self.new_tokens)

    @property
    def output_tokens(self) -> int:
        return sum(self.new_tokens)

    def prompts(self, run: int) -> list[list[int]]:
        return draw_prompts(self.requests, self.prompt_len, self.vocab, f"{self.seed}/{self.name}/{run}")

    def by_length(self) -> dict[int, list[int]]:
        """Request indices grouped by ``max_new_tokens`` (one ``generate`` call per group)."""
        groups: dict[int, list[int]] = {}
        for index, n in enumerate(self.new_tokens):
            groups.setdefault(n, []).append(index)
        return groups

    def describe(self) -> dict[str, Any]:
        lengths = sorted(self.new_tokens)
        return {
            "name": self.name,
            "requests": self.requests,
            "prompt_len": self.prompt_len,
            "output_tokens": self.output_tokens,
            "new_tokens_median": statistics.median(lengths),
            "new_tokens_max": lengths[-1],
            "long_requests": sum(1 for n in lengths if n > statistics.median(lengths)),
            "seed": self.seed,
        }


def draw_prompts(n: int, length: int, vocab: int, seed: int | str) -> list[list[int]]:
    """``n`` prompts of ``length`` random token ids in ``[LOW_TOKEN, vocab)``."""
    rng = random.Random(seed)
    low = min(LOW_TOKEN, vocab // 2)
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(n)]


def long_tail_lengths(
    requests: int,
    median: int,
    *,
    fraction: float = LONG_FRACTION,
    factor: int = LONG_FACTOR,
    seed: int | str = 0,
) -> tuple[int, ...]:
    """``max_new_tokens`` per request: ``round(fraction * requests)`` (at least one) requests, at seeded
    positions, ask ``factor * median``; the rest ask ``median`` (so it stays the median while the
    long ones are fewer than half)."""
    if not 0 < fraction < 0.5:
        raise ValueError(f"long-tail fraction {fraction} must be in (0, 0.5): the median must stay {median}")
    long = set(random.Random(f"{seed}/longtail").sample(range(requests), max(1, round(requests * fraction))))
    return tuple(median * factor if i in long else median for i in range(requests))


def make_workloads(
    names: Iterable[str],
    *,
    requests: int,
    prompt_len: int,
    new_tokens: int,
    vocab: int,
    seed: int = 0,
    long_fraction: float = LONG_FRACTION,
    long_factor: int = LONG_FACTOR,
) -> list[Workload]:
    """``fixed``: every request asks ``new_tokens``; ``longtail``: see ``long_tail_lengths``."""
    if min(requests, prompt_len, new_tokens, vocab) < 1:
        raise ValueError("requests, prompt_len, new_tokens and vocab must be positive")
    out = []
    for name in names:
        if name == "fixed":
            lengths: tuple[int, ...] = (new_tokens,) * requests
        elif name == "longtail":
            lengths = long_tail_lengths(
                requests, new_tokens, fraction=long_fraction, factor=long_factor, seed=seed
            )
        else:
            raise ValueError(f"unknown workload {name!r}: fixed or longtail")
        out.append(Workload(name, lengths, prompt_len, vocab, seed))
    return out


def warmup_workload(prompt_len: int, vocab: int, *, requests: int = 8, new_tokens: int = 16) -> Workload:
    """The small generation each mode runs before timing (prompts of its own: nothing timed reuses them)."""
    return Workload("warmup", (new_tokens,) * requests, prompt_len, vocab, seed=-1)


# ---------------------------------------------------------------------------------------------- rows


def row(
    mode: str,
    *,
    model: str,
    engine: str,
    workload: Workload,
    seconds: Sequence[float],
    client: str | None = None,
    reference: bool = True,
) -> dict[str, Any]:
    """One mode x workload: every timed run's seconds, the best and the median, as output tokens/s.
    ``client``: how a stock row's requests were sent; ``reference``: whether a stock row may be the
    reference the other modes are compared with."""
    if not seconds or min(seconds) <= 0:
        raise ValueError(f"{mode}/{workload.name}: no positive timings ({list(seconds)})")
    best, median = min(seconds), statistics.median(seconds)
    return {
        "mode": mode,
        "client": client,
        "reference": reference if mode == "stock" else None,
        "engine": engine,
        "model": model,
        "workload": workload.name,
        "requests": workload.requests,
        "output_tokens": workload.output_tokens,
        "seconds": [round(s, 3) for s in seconds],
        "best_s": round(best, 3),
        "median_s": round(median, 3),
        "tok_per_s": workload.output_tokens / best,
        "tok_per_s_median": workload.output_tokens / median,
    }


def label(r: Mapping[str, Any]) -> str:
    """``stock/batch``, ``runtime``, ...; ``(earlier)`` for a row taken from an earlier run's JSON."""
    name = f"{r['mode']}/{r['client']}" if r.get("client") else str(r["mode"])
    return f"{name} (earlier)" if r.get("source") else name


def references(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(model, workload) -> the stock row with the best tok/s (of its clients: concurrent, batch;
    rows with ``reference: False``, e.g. stock not asked for the logprobs the runtime gets, are left
    out)."""
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in rows:
        if r["mode"] != "stock" or r.get("reference") is False:
            continue
        key = (r["model"], r["workload"])
        if key not in out or r["tok_per_s"] > out[key]["tok_per_s"]:
            out[key] = r
    return out


def with_ratios(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``rows`` with ``vs_stock`` (best / best of the reference) and ``vs_stock_median``
    (median / the reference's median), None where no stock figure exists; the reference row gets
    ``is_reference: True``."""
    rows = list(rows)
    refs = references(rows)
    out = []
    for r in rows:
        ref = refs.get((r["model"], r["workload"]))
        out.append(
            {
                **r,
                "is_reference": ref is r,
                "vs_stock": None if ref is None else r["tok_per_s"] / ref["tok_per_s"],
                "vs_stock_median": None if ref is None else r["tok_per_s_median"] / ref["tok_per_s_median"],
            }
        )
    return out


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def format_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """A Markdown table: one line per mode x workload (the reference stock row marked ``*``)."""
    lines = [
        "| mode | model | workload | requests | output tokens | seconds (each run) | tok/s best "
        "| tok/s median | vs stock (best) | vs stock (median) |",
        "|---|---|---|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r in with_ratios(rows):
        mark = " *" if r["is_reference"] else ""
        lines.append(
            f"| {label(r)}{mark} | {r['model']} | {r['workload']} | {r['requests']} | {r['output_tokens']:,} "
            f"| {' / '.join(f'{s:.2f}' for s in r['seconds'])} | {r['tok_per_s']:,.0f} "
            f"| {r['tok_per_s_median']:,.0f} | {_ratio(r['vs_stock'])} | {_ratio(r['vs_stock_median'])} |"
        )
    return "\n".join(lines)


def target_lines(rows: Iterable[Mapping[str, Any]], target: float = TARGET) -> list[str]:
    """``runtime/stock >= 0.95: met|missed (...)`` per model x workload measured in both modes (on the
    best runs; the medians' ratio is given too); one ``not measured`` line if there is none."""
    out = []
    for r in with_ratios(rows):
        if r["mode"] != "runtime" or r["vs_stock"] is None:
            continue
        verdict = "met" if r["vs_stock"] >= target else "missed"
        out.append(
            f"runtime/stock >= {target:.2f}: {verdict} ({r['model']}, {r['workload']}: "
            f"{r['vs_stock']:.3f} best of {len(r['seconds'])} runs, {r['vs_stock_median']:.3f} median)"
        )
    return out or [f"runtime/stock >= {target:.2f}: not measured (needs modes stock and runtime)"]


def report(
    rows: Iterable[Mapping[str, Any]],
    *,
    workloads: Iterable[Workload],
    args: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    target: float = TARGET,
) -> dict[str, Any]:
    """The JSON document: arguments, workloads, rows with ratios, the target lines."""
    rows = list(rows)
    return {
        "benchmark": "rollout_throughput",
        "target": target,
        "args": {k: v if isinstance(v, int | float | bool | None) else str(v) for k, v in args.items()},
        "workloads": [w.describe() for w in workloads],
        "rows": with_ratios(rows),
        "targets": target_lines(rows, target),
        **(extra or {}),
    }


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def stock_rows_from(
    document: Mapping[str, Any], *, model: str, workloads: Iterable[Workload]
) -> list[dict[str, Any]]:
    """The stock rows of an earlier run's JSON for ``model`` and these workloads (same requests and
    output tokens), so a later invocation (e.g. ``--modes hf``) can give ratios without a new stock run.
    Raises ValueError when a workload has no matching stock row."""
    shapes = {w.name: (w.requests, w.output_tokens) for w in workloads}
    out = []
    for r in document.get("rows", []):
        if r.get("mode") == "stock" and r.get("model") == model and r.get("workload") in shapes:
            if (r["requests"], r["output_tokens"]) != shapes[r["workload"]]:
                want_requests, want_tokens = shapes[r["workload"]]
                raise ValueError(
                    f"stock row {label(r)}/{r['workload']}: {r['requests']} requests and {r['output_tokens']} "
                    f"output tokens, this run's workload: {want_requests} requests and {want_tokens}"
                )
            kept = {k: v for k, v in r.items() if k not in ("is_reference", "vs_stock", "vs_stock_median")}
            out.append({**kept, "source": "earlier run"})
    missing = sorted(set(shapes) - {r["workload"] for r in out})
    if missing:
        raise ValueError(f"no stock rows for model {model!r}, workload(s) {', '.join(missing)}")
    return out
