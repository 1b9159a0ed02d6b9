"""model.trustRemoteCode, model.tokenizer and training.seed reach the hf engine: real hf_server
processes (``EngineProcess``, no Ray) on random-weight 2-layer models with SmolLM2's tokenizer.

The manager's side (spec -> engine arguments) is checked in tests/unit/test_rollout_processes.py and
tests/integration/test_rollout_manager.py; SGLang's flags against its parser in the contract test."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.rollout.engine_actor import EngineProcess
from rljob_runtime.rollout.hf_engine import HFEngine

CUSTOM_CODE = """from transformers import LlamaConfig, LlamaForCausalLM


class RemoteLlamaConfig(LlamaConfig):
    model_type = "remote_llama"


class RemoteLlamaForCausalLM(LlamaForCausalLM):
    config_class = RemoteLlamaConfig
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def remote_code_model(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a checkpoint whose architecture is its own code (config.json's auto_map)."""
    dest = tmp_path_factory.mktemp("remote") / "model"
    shutil.copytree(tiny, dest)
    (dest / "remote_llama.py").write_text(CUSTOM_CODE)
    config = json.loads((dest / "config.json").read_text())
    config |= {
        "model_type": "remote_llama",
        "architectures": ["RemoteLlamaForCausalLM"],
        "auto_map": {
            "AutoConfig": "remote_llama.RemoteLlamaConfig",
            "AutoModelForCausalLM": "remote_llama.RemoteLlamaForCausalLM",
        },
    }
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="module")
def lowercase_tokenizer(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's tokenizer with a lower-casing normalizer: same vocabulary, different encodings."""
    from tokenizers import normalizers

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()
    dest = tmp_path_factory.mktemp("tok") / "lower"
    tokenizer.save_pretrained(dest)
    return dest


def _engine(model: Path, tmp_path: Path, **kwargs: Any) -> EngineProcess:
    return EngineProcess(
        kind="hf",
        model_path=str(model),
        host="127.0.0.1",
        log_dir=str(tmp_path),
        startup_timeout_s=120,
        **kwargs,
    )


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[EngineProcess]]:
    started: list[EngineProcess] = []
    yield started
    for engine in started:
        engine.shutdown()


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _sample(url: str) -> list[list[int]]:
    """Four sampled continuations of one prompt (temperature 1: the seed decides them)."""
    body = {
        "input_ids": [[1780, 314, 216, 34, 27, 35, 47]] * 4,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True},
    }
    return [out["output_ids"] for out in _post(f"{url}/generate", body)]


def test_trust_remote_code_reaches_the_hf_engine(
    remote_code_model: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    with pytest.raises(ValueError, match="trust_remote_code"):  # what a server without the flag meets
        HFEngine(remote_code_model)
    trusted = _engine(remote_code_model, tmp_path / "trusted", trust_remote_code=True)
    engines.append(trusted)
    url = trusted.start()
    info = json.loads(urllib.request.urlopen(f"{url}/get_model_info", timeout=30).read())
    assert info["model_type"] == "remote_llama", info
    assert len(_sample(url)[0]) == 12


def test_model_tokenizer_reaches_the_hf_engine(
    tiny: Path, lowercase_tokenizer: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    own = HFEngine(tiny)
    lower = HFEngine(tiny, tokenizer_path=lowercase_tokenizer)
    assert own.encode("HELLO World") != own.encode("hello world")
    assert lower.encode("HELLO World") == lower.encode("hello world") == own.encode("hello world")
    engine = _engine(tiny, tmp_path, tokenizer_path=str(lowercase_tokenizer))
    engines.append(engine)
    url = engine.start()
    info = json.loads(urllib.request.urlopen(f"{url}/get_model_info", timeout=30).read())
    assert Path(info["tokenizer_path"]) == lowercase_tokenizer
    upper = _post(f"{url}/generate", {"text": "HELLO World", "sampling_params": {"max_new_tokens": 1}})
    assert upper["meta_info"]["prompt_tokens"] == len(own.encode("hello world"))


def test_the_seed_decides_the_samples(tiny: Path, tmp_path: Path, engines: list[EngineProcess]) -> None:
    for index, seed in enumerate((7, 7, 8)):
        engines.append(_engine(tiny, tmp_path / str(index), seed=seed))
    with ThreadPoolExecutor(len(engines)) as pool:  # the servers load side by side
        urls = list(pool.map(lambda engine: engine.start(), engines))
    first, again, other = (_sample(url) for url in urls)
    assert first == again, "the same seed must reproduce the samples"
    assert first != other, "another seed must give other samples"
