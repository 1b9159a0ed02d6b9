"""Prompt data from a JSONL file (DataSpec): parsing, chat templates, length filtering, a seeded
per-epoch order with a resumable position, and named evaluation sets.

Parsing and ordering are pure; only ``read_lines`` touches the file system.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rljob_api.spec_workload import DataSpec

from .sample import ChatMessages, Sample


class DataError(ValueError):
    """Prompt data that cannot be trained on; raised before training starts, naming the problem."""


@dataclass(frozen=True)
class Prompt:
    """One prompt row. ``index`` is its 0-based row in the file: stable across epochs and resumes."""

    index: int
    prompt: str | ChatMessages
    text: str
    prompt_ids: list[int] | None = None
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_samples(self, n: int, first_index: int = 0) -> list[Sample]:
        """``n`` samples of this prompt (one GRPO group), numbered from ``first_index``."""
        return [
            Sample(
                group_index=self.index,
                index=first_index + i,
                prompt=self.text,
                prompt_ids=list(self.prompt_ids or []),
                label=self.label,
                metadata=dict(self.metadata),
            )
            for i in range(n)
        ]


@dataclass(frozen=True)
class LoadedPrompts:
    prompts: list[Prompt]
    dropped_too_long: int  # reported at start-up so users see what max_prompt_length cost them


def read_lines(path: str | Path) -> list[str]:
    """The file's lines; a missing file is a DataError naming the path."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"prompt data {p}: no such file")
    return p.read_text(encoding="utf-8").splitlines()


def _render(
    raw: str | ChatMessages, apply_chat_template: bool, tokenizer: Any, chat_template: str | None, where: str
) -> str:
    if not apply_chat_template:
        if not isinstance(raw, str):
            raise DataError(f"{where}: prompt is a list of chat messages but applyChatTemplate is false")
        return raw
    messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template
    )


def _check_prompt(raw: Any, where: str, key: str) -> str | ChatMessages:
    if isinstance(raw, str):
        return raw
    ok = isinstance(raw, list) and raw and all(isinstance(m, dict) and "role" in m for m in raw)
    if not ok:
        raise DataError(f"{where}: {key!r} must be a string or a list of {{role, content}} messages")
    return raw


def parse_prompts(
    lines: Iterable[str],
    spec: DataSpec,
    *,
    source: str = "<memory>",
    tokenizer: Any = None,
    chat_template: str | None = None,
    require_label: bool = False,
) -> LoadedPrompts:
    """Parse JSONL lines into prompts; render and (when a tokenizer is given) tokenize each one."""
    if spec.apply_chat_template and tokenizer is None:
        raise DataError(f"{source}: applyChatTemplate is true but no tokenizer was given")
    if spec.max_prompt_length is not None and tokenizer is None:
        raise DataError(f"{source}: maxPromptLength needs a tokenizer to count tokens")
    prompts: list[Prompt] = []
    dropped = 0
    row = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if spec.input_key not in obj:
            raise DataError(f"{where}: input key {spec.input_key!r} missing (keys: {', '.join(sorted(obj))})")
        if require_label and obj.get(spec.label_key) is None:
            raise DataError(
                f"{where}: label key {spec.label_key!r} missing and the reward compares to a label"
            )
        raw = _check_prompt(obj[spec.input_key], where, spec.input_key)
        metadata = obj.get(spec.metadata_key) or {}
        if not isinstance(metadata, dict):
            raise DataError(f"{where}: metadata key {spec.metadata_key!r} must be a JSON object")
        text = _render(raw, spec.apply_chat_template, tokenizer, chat_template, where)
        ids = None
        if tokenizer is not None:
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        index, row = row, row + 1
        if spec.max_prompt_length is not None and ids is not None and len(ids) > spec.max_prompt_length:
            dropped += 1
            continue
        prompts.append(Prompt(index, raw, text, ids, obj.get(spec.label_key), metadata))
    if row == 0:
        raise DataError(f"{source}: no prompts (the file is empty)")
    if not prompts:
        raise DataError(
            f"{source}: all {row} prompts are longer than maxPromptLength {spec.max_prompt_length} tokens"
        )
    return LoadedPrompts(prompts, dropped)


def epoch_order(num: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Positions in the order of one epoch: a permutation that depends only on (seed, epoch)."""
    order = list(range(num))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


class PromptSource:
    """Cycles through the prompts, one seeded shuffle per epoch; ``state_dict`` is the exact position."""

    def __init__(self, prompts: Sequence[Prompt], *, seed: int = 42, shuffle: bool = True) -> None:
        if not prompts:
            raise DataError("PromptSource: no prompts")
        self.prompts = list(prompts)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0  # prompts already handed out in the current epoch
        self._order = epoch_order(len(self.prompts), seed, 0, shuffle)

    @classmethod
    def from_spec(
        cls,
        spec: DataSpec,
        *,
        seed: int,
        tokenizer: Any = None,
        chat_template: str | None = None,
        require_label: bool = False,
    ) -> tuple[PromptSource, LoadedPrompts]:
        loaded = parse_prompts(
            read_lines(spec.path),
            spec,
            source=spec.path,
            tokenizer=tokenizer,
            chat_template=chat_template,
            require_label=require_label,
        )
        return cls(loaded.prompts, seed=seed, shuffle=spec.shuffle), loaded

    def __len__(self) -> int:
        return len(self.prompts)

    def next_batch(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts; a batch that crosses the end of an epoch continues into the next."""
        out: list[Prompt] = []
        while len(out) < n:
            if self.offset == len(self.prompts):
                self.epoch += 1
                self.offset = 0
                self._order = epoch_order(len(self.prompts), self.seed, self.epoch, self.shuffle)
            take = min(n - len(out), len(self.prompts) - self.offset)
            out.extend(self.prompts[i] for i in self._order[self.offset : self.offset + take])
            self.offset += take
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_prompts": len(self.prompts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position; refuses a state saved over different data or a different seed."""
        for key, mine in (("num_prompts", len(self.prompts)), ("seed", self.seed), ("shuffle", self.shuffle)):
            if state.get(key) != mine:
                raise DataError(
                    f"data-source state does not match this data: {key} is {state.get(key)!r} in the "
                    f"checkpoint but {mine!r} now"
                )
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if not 0 <= offset <= len(self.prompts) or epoch < 0:
            raise DataError(f"data-source state out of range: epoch {epoch}, offset {offset}")
        self.epoch, self.offset = epoch, offset
        self._order = epoch_order(len(self.prompts), self.seed, epoch, self.shuffle)


@dataclass(frozen=True)
class EvalDataset:
    """A named evaluation set: every prompt, in file order, ``n_samples_per_prompt`` times."""

    name: str
    prompts: list[Prompt]
    n_samples_per_prompt: int
    max_response_len: int | None
    dropped_too_long: int = 0

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        for p in self.prompts:
            out.extend(p.to_samples(self.n_samples_per_prompt, first_index=len(out)))
        return out


def load_eval_datasets(
    spec: DataSpec,
    *,
    tokenizer: Any = None,
    chat_template: str | None = None,
    require_label: bool = False,
) -> list[EvalDataset]:
    """Load every ``data.eval.datasets`` entry with the same keys and template as the training data."""
    out = []
    for ds in spec.eval.datasets:
        loaded = parse_prompts(
            read_lines(ds.path),
            spec,
            source=f"eval dataset {ds.name!r} ({ds.path})",
            tokenizer=tokenizer,
            chat_template=chat_template,
            require_label=require_label,
        )
        n = ds.n_samples_per_prompt or spec.eval.n_samples_per_prompt
        out.append(EvalDataset(ds.name, loaded.prompts, n, ds.max_response_len, loaded.dropped_too_long))
    return out
