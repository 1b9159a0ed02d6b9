"""The pure parts of hub downloads: model.path syntax, the files fetched, messages, progress lines,
where settings come from. Downloads themselves: tests/integration/test_hub_download.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from rljob_api.status import Progress
from rljob_runtime.models.errors import ModelNotFoundError
from rljob_runtime.models.hub_rules import (
    Failure,
    HubError,
    HubRef,
    HubSettings,
    Throttle,
    check_disk_space,
    failure_message,
    format_size,
    parse_hub_ref,
    progress_text,
    select_files,
)
from rljob_runtime.report import JobIdentity, message_document

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Qwen/Qwen3-4B", HubRef("Qwen/Qwen3-4B")),
        ("Qwen/Qwen3-4B@main", HubRef("Qwen/Qwen3-4B", "main")),
        ("meta-llama/Llama-3.1-8B@v1.0", HubRef("meta-llama/Llama-3.1-8B", "v1.0")),
        ("org/name@refs/pr/3", HubRef("org/name", "refs/pr/3")),
        (f"org/name@{COMMIT}", HubRef("org/name", COMMIT)),
        ("/shared/models/Qwen3-4B", None),  # absolute: a local path
        ("./models/x", None),
        ("~/models/x", None),
        ("models/x/y", None),  # two slashes: a local path
        ("Qwen3-4B", None),  # no organisation
        ("org/na--me", None),  # the hub refuses -- and .. in names
        ("org/na..me", None),
        ("/data/model@v2", None),  # @ in a local path
    ],
)
def test_model_path_is_a_hub_ref_or_a_local_path(text: str, expected: HubRef | None) -> None:
    assert parse_hub_ref(text) == expected


@pytest.mark.parametrize(
    "text", ["org/name@", "org/name@bad rev", "org/name@../x", "org/name@a//b", "org/name@-x"]
)
def test_a_bad_revision_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(
        HubError, match=r"^model.tokenizer .* after @ is not a revision; write Org/Name@"
    ) as info:
        parse_hub_ref(text, field="model.tokenizer")
    assert isinstance(info.value, ModelNotFoundError)  # what the driver and the CLI catch


def test_ref_text_pins_and_cache_ref_name() -> None:
    assert str(HubRef("org/name")) == "org/name@main" and HubRef("org/name").ref_name == "main"
    assert str(HubRef("org/name", "v2")) == "org/name@v2"
    assert HubRef("org/name", COMMIT).pinned and not HubRef("org/name", "main").pinned
    assert not HubRef("org/name", COMMIT[:12]).pinned  # a short hash can be ambiguous: resolved by the hub


REPO_FILES = [
    ".gitattributes",
    "README.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "consolidated.safetensors",  # Mistral's original format, beside the transformers shards
    "pytorch_model-00001-of-00002.bin",
    "pytorch_model-00002-of-00002.bin",
    "pytorch_model.bin.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "merges.txt",
    "vocab.json",
    "chat_template.jinja",
    "modeling_custom.py",
    "model.gguf",
    "model.onnx",
    "onnx/model.onnx",
    "original/consolidated.00.pth",
    "assets/logo.png",
]


def test_safetensors_win_and_nothing_else_heavy_is_fetched() -> None:
    assert select_files(REPO_FILES, weights=True) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "modeling_custom.py",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
        "vocab.json",
    ]


def test_pytorch_bin_only_when_there_are_no_safetensors() -> None:
    names = [n for n in REPO_FILES if not n.endswith((".safetensors", ".safetensors.index.json"))]
    chosen = select_files(names, weights=True)
    assert [n for n in chosen if "pytorch_model" in n] == [
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
    ]
    assert not any(n.endswith((".gguf", ".onnx", ".pth", ".md", ".png")) for n in chosen)


def test_a_tokenizer_fetches_no_weights() -> None:
    chosen = select_files(REPO_FILES, weights=False)
    assert "tokenizer.json" in chosen and "config.json" in chosen
    assert not any(n.endswith((".safetensors", ".bin")) or ".index." in n for n in chosen)


def test_a_repository_without_weights_or_config_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"no transformers weights \(model\*.safetensors or pytorch_model\*.bin\)"
    ):
        select_files(["config.json", "model.gguf", "tokenizer.json"], weights=True)
    with pytest.raises(ValueError, match=r"no config\.json at its top level"):
        select_files(["model.safetensors", "sub/config.json"], weights=True)


def test_sizes_and_progress_lines() -> None:
    assert [format_size(n) for n in (850, 12_345, 538_100_000, 8_000_000_000)] == [
        "850 B",
        "12.3 kB",
        "538.1 MB",
        "8.0 GB",
    ]
    ref = HubRef("Org/Name", "main")
    assert progress_text(ref, 1_200_000_000, 8_000_000_000) == "downloading Org/Name@main: 1.2/8.0 GB (15%)"
    assert progress_text(ref, 0, 16_400_000) == "downloading Org/Name@main: 0.0/16.4 MB (0%)"
    assert progress_text(ref, 0, 0) == "downloading Org/Name@main: 0/0 B (100%)"


def test_throttle_lets_one_line_through_per_interval() -> None:
    now = [100.0]
    throttle = Throttle(10.0, clock=lambda: now[0])
    seen = []
    for t in (100.0, 101.0, 109.9, 110.0, 115.0, 121.0):
        now[0] = t
        seen.append(throttle.due())
    assert seen == [True, False, False, True, False, True]


SETTINGS = HubSettings("https://hub.example", Path("/var/cache/rljob/huggingface/hub"), None, "none")
WITH_TOKEN = HubSettings(
    SETTINGS.endpoint, SETTINGS.cache_dir, "hf_x", "/run/token (resources.secrets.huggingFaceToken)"
)


@pytest.mark.parametrize(
    ("failure", "settings", "says"),
    [
        (
            Failure.GATED_NO_TOKEN,
            SETTINGS,
            "is gated: set resources.secrets.huggingFaceToken to a Secret holding a token that has "
            "accepted its terms (https://hub.example/Org/Name)",
        ),
        (
            Failure.GATED_NO_ACCESS,
            WITH_TOKEN,
            "has no access to it: accept its terms at https://hub.example/Org/Name",
        ),
        (Failure.TOKEN_REFUSED, WITH_TOKEN, "refused the token from /run/token"),
        (
            Failure.NOT_FOUND,
            SETTINGS,
            "no such repository on https://hub.example: check the id (Org/Name); if it is private, set "
            "resources.secrets.huggingFaceToken",
        ),
        (Failure.NOT_FOUND, WITH_TOKEN, "if it is private, the token from /run/token"),
        (Failure.REVISION_NOT_FOUND, SETTINGS, "Org/Name has no revision 'v9' on https://hub.example"),
        (
            Failure.UNREACHABLE,
            SETTINGS,
            "cannot reach the hub at https://hub.example (ConnectError: x) and this revision is not in "
            "the cache /var/cache/rljob/huggingface/hub: let the pods reach it, or set HF_ENDPOINT "
            "(resources.env) to a mirror",
        ),
        (Failure.HUB_ERROR, SETTINGS, "answered HTTP 503: try again later, or set HF_ENDPOINT"),
        (
            Failure.DISK_FULL,
            SETTINGS,
            "no space left in the model cache /var/cache/rljob/huggingface/hub (x): give "
            "resources.modelCache a larger volume",
        ),
        (Failure.OTHER, SETTINGS, "download from https://hub.example failed: x"),
    ],
)
def test_each_failure_is_one_line_naming_the_field_and_what_to_do(
    failure: Failure, settings: HubSettings, says: str
) -> None:
    detail = {Failure.UNREACHABLE: "ConnectError: x", Failure.HUB_ERROR: "HTTP 503"}.get(failure, "x")
    text = failure_message(
        failure, field="model.path", ref=HubRef("Org/Name", "v9"), settings=settings, detail=detail
    )
    assert text.startswith("model.path Org/Name@v9")
    assert says in text and "\n" not in text


def test_disk_space_check() -> None:
    assert check_disk_space(10, 10) is None
    assert check_disk_space(16_400_000, 4_000_000) == "16.4 MB to download, 4.0 MB free"


def test_settings_come_from_the_environment_at_each_call(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("hf_from_secret\n")
    env = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_TOKEN_PATH": str(token_file),
        "HF_ENDPOINT": "http://mirror:8080/",
    }
    settings = HubSettings.from_env(env)
    assert settings.endpoint == "http://mirror:8080"
    assert settings.cache_dir == tmp_path / "hf" / "hub"
    assert settings.token == "hf_from_secret" and str(token_file) in settings.token_source
    assert (
        HubSettings.from_env(env | {"HF_TOKEN": "hf_env"}).token == "hf_env"
    )  # as huggingface_hub orders them
    assert HubSettings.from_env(env | {"HF_HUB_CACHE": str(tmp_path / "c")}).cache_dir == tmp_path / "c"
    bare = HubSettings.from_env({"HF_HOME": str(tmp_path / "empty")})
    assert (bare.endpoint, bare.token, bare.token_source) == ("https://huggingface.co", None, "none")


def test_job_identity_from_the_operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLJOB_JOB_NAME", raising=False)
    monkeypatch.delenv("RLJOB_NAMESPACE", raising=False)
    assert JobIdentity.from_env() is None
    monkeypatch.setenv("RLJOB_JOB_NAME", "qwen-math")
    monkeypatch.setenv("RLJOB_NAMESPACE", "ml")
    assert JobIdentity.from_env() == JobIdentity("qwen-math", "ml")


def test_the_status_message_document_fits_the_crd() -> None:
    doc = message_document(
        "downloading Org/Name@main: 1.2/8.0 GB (15%)", now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    )
    assert doc == {
        "message": "downloading Org/Name@main: 1.2/8.0 GB (15%)",
        "updatedAt": "2026-01-02T03:04:05Z",
    }
    assert Progress.model_validate_json(json.dumps(doc)).message == doc["message"]
    assert len(message_document("x" * 5000, now=datetime.now(UTC))["message"]) == 1024
    crd = yaml.safe_load((REPO / "crds" / "rltrainingjobs.rljob.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    message = schema["properties"]["status"]["properties"]["progress"]["properties"]["message"]
    assert message["type"] == "string" and message["maxLength"] == 1024  # else the API server prunes it
