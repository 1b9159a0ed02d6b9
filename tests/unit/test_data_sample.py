"""Sample round-trips through JSON (checkpoints of partial rollouts, remote rewards)."""

from __future__ import annotations

import json

import pytest

from rljob_runtime.data.sample import Sample, Status


def test_sample_json_round_trip() -> None:
    s = Sample(
        group_index=3,
        index=7,
        prompt=[{"role": "user", "content": "1+1?"}],
        prompt_ids=[1, 2],
        response="2",
        response_ids=[5, 6],
        response_length=2,
        label="2",
        reward={"score": 1.0},
        loss_mask=[1, 0],
        status=Status.TRUNCATED,
        rollout_logprobs=[-0.5, -1.25],
        weight_versions=["3", "4"],
        metadata={"source": "gsm8k"},
    )
    text = s.to_json()
    assert json.loads(text)["status"] == "truncated"
    back = Sample.from_json(text)
    assert back == s
    assert back.status is Status.TRUNCATED
    assert back.tokens == [1, 2, 5, 6]


def test_defaults_and_loss_mask() -> None:
    s = Sample(response_ids=[1, 2, 3], response_length=3)
    assert s.status is Status.PENDING
    assert s.effective_loss_mask() == [1, 1, 1]
    assert Sample.from_dict(Sample().to_dict()) == Sample()


def test_unknown_field_refused() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        Sample.from_dict({"tokens_typo": []})
