"""One prompt/response pair as it moves through rollout, reward and training (slime's Sample)."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ChatMessages = list[dict[str, Any]]

# SGLang's label for the weights an engine started with (engine_api.DEFAULT_WEIGHT_VERSION;
# spelled out so data/ does not import rollout/)
_INITIAL_LABEL = "default"
_STEP_LABEL = re.compile(r"[0-9]+")


def version_number(label: str | None) -> int | None:
    """The weight version an engine's ``weight_version`` label stands for, or None if it is not ours.

    We label the initial weights ``"default"`` (SGLang's own default, version 0) and every later push
    with the decimal step number it carries (``"3"`` -> 3).
    """
    if label == _INITIAL_LABEL:
        return 0
    if isinstance(label, str) and _STEP_LABEL.fullmatch(label):
        return int(label)
    return None


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
    # training.routingReplay: SGLang's ``meta_info.routed_experts`` of the answer that ended the
    # response (base64 int32 [prompt + response - 1, layers, top-k]; ``engine_api.routed_experts``).
    rollout_routed_experts: str | None = None
    # Ordered distinct weight_version labels of the engines that generated the response.
    weight_versions: list[str] = field(default_factory=list)
    # One entry per response token: the weight version (``version_number``) that generated it; empty
    # when unknown (multi-turn hooks, engines with labels of their own). A continued partial response
    # may span versions.
    token_versions: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> list[int]:
        """Prompt and response token ids together (slime's ``tokens``)."""
        return [*self.prompt_ids, *self.response_ids]

    @property
    def resumable(self) -> bool:
        """A partial response a later request can continue: aborted (or pending) with tokens kept."""
        return self.status in (Status.ABORTED, Status.PENDING) and bool(self.response_ids)

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
        """Inverse of ``to_dict``; unknown keys are refused so a stale checkpoint fails loudly (missing
        keys take their defaults, so checkpoints from before a field was added still load)."""
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


def stale_token_mask(sample: Sample) -> list[int]:
    """``sample``'s effective loss mask with tokens older than its newest weight version set to 0.

    slime's ``--mask-offpolicy-in-partial-rollout``: of a response continued across a weight update,
    only the tokens of the newest weights are trained on. Without per-token versions (or if they do
    not line up with ``response_ids``) this is the plain effective mask.
    """
    mask = sample.effective_loss_mask()
    versions = sample.token_versions
    if not versions or len(versions) != len(sample.response_ids) or len(mask) != len(versions):
        return list(mask)
    newest = max(versions)
    return [m if v == newest else 0 for m, v in zip(mask, versions, strict=True)]
