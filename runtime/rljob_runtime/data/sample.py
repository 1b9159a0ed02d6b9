"""One prompt/response pair as it moves through rollout, reward and training (slime's Sample)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ChatMessages = list[dict[str, Any]]


class Status(StrEnum):
    """Where a sample's generation ended; only completed/truncated samples are trained on."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """A prompt, one generated response and everything the trainer needs about it.

    ``group_index`` is the prompt's stable index in the data source (all samples of one prompt share
    it; GRPO groups by it); ``index`` is the sample's position in the rollout batch.
    """

    group_index: int | None = None
    index: int | None = None
    prompt: str | ChatMessages = ""
    prompt_ids: list[int] = field(default_factory=list)
    response: str = ""
    response_ids: list[int] = field(default_factory=list)
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    # One entry per response token: 1 = trained on, 0 = masked (tool output in multi-turn).
    loss_mask: list[int] | None = None
    status: Status = Status.PENDING
    rollout_logprobs: list[float] | None = None
    weight_versions: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> list[int]:
        """Prompt and response token ids together (slime's ``tokens``)."""
        return [*self.prompt_ids, *self.response_ids]

    def effective_loss_mask(self) -> list[int]:
        """The loss mask, defaulting to every response token."""
        if self.loss_mask is not None:
            return self.loss_mask
        return [1] * (self.response_length or len(self.response_ids))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (for checkpoints of partial rollouts and for remote rewards)."""
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """Inverse of ``to_dict``; unknown keys are refused so a stale checkpoint fails loudly."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"Sample.from_dict: unknown field(s) {', '.join(unknown)}")
        kwargs = dict(data)
        if "status" in kwargs:
            kwargs["status"] = Status(kwargs["status"])
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Sample:
        return cls.from_dict(json.loads(text))
