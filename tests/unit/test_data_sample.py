"""Sample round-trips through JSON (checkpoints of partial rollouts, remote rewards)."""

from __future__ import annotations

import json

import pytest

from rljob_runtime import engine_api
from rljob_runtime.data.sample import Sample, Status, stale_token_mask, version_number


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
        token_versions=[3, 4],
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


def test_a_checkpoint_from_before_token_versions_still_loads() -> None:
    old = Sample(prompt_ids=[1], response_ids=[2], response_length=1).to_dict()
    del old["token_versions"]
    assert Sample.from_dict(old).token_versions == []


@pytest.mark.parametrize(
    ("label", "number"),
    [
        (engine_api.DEFAULT_WEIGHT_VERSION, 0),
        ("default", 0),
        ("0", 0),
        ("3", 3),
        ("120", 120),
        (None, None),
        ("", None),
        ("v3", None),
        ("-1", None),
        ("3.0", None),
        ("3\n", None),
        ("\uff13", None),  # a fullwidth digit: str.isdecimal would take it
    ],
)
def test_version_number_reads_our_weight_version_labels(label: str | None, number: int | None) -> None:
    assert version_number(label) == number


@pytest.mark.parametrize(
    ("status", "ids", "resumable"),
    [
        (Status.ABORTED, [1], True),
        (Status.PENDING, [1, 2], True),
        (Status.ABORTED, [], False),
        (Status.PENDING, [], False),
        (Status.COMPLETED, [1], False),
        (Status.TRUNCATED, [1], False),
        (Status.FAILED, [1], False),
    ],
)
def test_resumable_is_a_partial_response_with_tokens(status: Status, ids: list[int], resumable: bool) -> None:
    assert (
        Sample(prompt_ids=[9], response_ids=ids, response_length=len(ids), status=status).resumable
        is resumable
    )


def test_stale_token_mask_keeps_only_the_newest_versions_tokens() -> None:
    s = Sample(response_ids=[1, 2, 3, 4, 5], response_length=5, token_versions=[2, 2, 3, 3, 3])
    assert stale_token_mask(s) == [0, 0, 1, 1, 1]
    s.loss_mask = [1, 1, 0, 1, 1]  # a masked tool token stays masked
    assert stale_token_mask(s) == [0, 0, 0, 1, 1]
    s.token_versions = [4, 4, 4, 4, 4]  # one version: nothing is stale
    assert stale_token_mask(s) == [1, 1, 0, 1, 1]
    # unknown or misaligned versions: the plain effective mask
    for versions in ([], [2, 3]):
        s.token_versions = versions
        assert stale_token_mask(s) == s.effective_loss_mask() == [1, 1, 0, 1, 1]
    assert stale_token_mask(Sample(response_ids=[1, 2], response_length=2)) == [1, 1]
