"""The spec summary `rljob-runtime validate` prints says what the operator's conversions will do."""

from __future__ import annotations

from rljob_api.describe import describe
from rljob_api.resource import parse_spec

from spec_cases import patched


def _lines(patch: dict) -> dict[str, str]:
    return dict(describe(parse_spec(patched(patch))))


def test_exports_and_the_megatron_conversion_are_named() -> None:
    lines = _lines(
        {
            "checkpoint": {
                "path": "/ckpt",
                "volume": {"claimName": "c"},
                "export": {"huggingFace": True, "steps": [20, 10]},
            },
            "resources": {"modelCache": {"claimName": "cache"}},
        }
    )
    assert lines["checkpoint"].endswith(
        "; exported as Hugging Face directories to /ckpt/hf/iter_<step> (the final one, step 10, step 20)"
    )
    assert lines["model"].endswith(
        "the operator converts it to a Megatron checkpoint in the model cache first (once per revision)"
    )


def test_nothing_is_said_when_nothing_is_converted() -> None:
    lines = _lines({})
    assert "export" not in lines["checkpoint"] and "Megatron" not in lines["model"]
