"""A job whose model.path is a hub id downloads it, once per revision, before Ray starts.

The hub is the one stand-in here (tests/hub_server.py: the hub's HTTP layout on a local port, since
the public hub is out of reach); huggingface_hub, the cache, the locks, transformers and the
runtime's prepare and CLI are the real ones.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hub_server import HubStandIn

from rljob_api.resource import parse_spec
from rljob_runtime import cli
from rljob_runtime.models import hub
from rljob_runtime.models.hub import HubError
from rljob_runtime.models.resolve import resolve_model
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.prepare import prepare

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "add-1digit.jsonl"
WEIGHTS = "/resolve/"  # what a file download requests (HEAD, then GET)
MODEL_FILES = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama, plus what a hub repository also holds and a job must not fetch."""
    path = make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", arch="llama", seed=0)
    (path / "pytorch_model.bin").write_bytes(b"\0" * 2048)  # the same weights in the old format
    (path / "model.gguf").write_bytes(b"GGUF" + b"\0" * 2048)
    (path / "onnx").mkdir()
    (path / "onnx" / "model.onnx").write_bytes(b"\0" * 2048)
    (path / "README.md").write_text("# tiny\n")
    return path


@pytest.fixture(scope="module")
def stand_in(model_dir: Path) -> Iterator[HubStandIn]:
    with HubStandIn() as server:
        server.add_repo("org/tiny", model_dir)
        server.add_repo("org/gated", model_dir, gated=True)
        server.add_token("hf_granted", granted=("org/gated",))
        server.add_token("hf_not_granted")
        yield server


@pytest.fixture
def env(stand_in: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubStandIn:
    """A fresh HF cache, the stand-in as HF_ENDPOINT, no token, no job to report to."""
    for var in (
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "RLJOB_JOB_NAME",
        "RLJOB_NAMESPACE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    stand_in.seconds_per_mb = 0.0
    return stand_in


def spec_doc(model: str, *, tokenizer: str | None = None) -> dict[str, Any]:
    return {
        "model": {"path": model, "dtype": "float32"} | ({"tokenizer": tokenizer} if tokenizer else {}),
        "data": {"path": str(DATA), "applyChatTemplate": False},
        "rollout": {"engine": "hf", "batchSize": 4, "nSamplesPerPrompt": 2, "maxResponseLen": 8},
        "training": {"backend": "torch", "numRollout": 2, "globalBatchSize": 8, "microBatchSize": 2},
        "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}},
        "reward": {"type": "math"},
    }


def since(server: HubStandIn, mark: int) -> list[tuple[str, str]]:
    return server.requests[mark:]


def test_a_job_downloads_the_model_once_and_transformers_loads_it(
    env: HubStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mark = len(env.requests)
    prepared = prepare(parse_spec(spec_doc("org/tiny")))
    path = Path(prepared.model_path)
    assert path.parent.parent == tmp_path / "hf" / "hub" / "models--org--tiny"  # the HF cache, under HF_HOME
    assert sorted(p.name for p in path.iterdir()) == MODEL_FILES  # no .bin, .gguf, onnx/, README
    fetched = sorted({p.rsplit("/", 1)[1] for m, p in since(env, mark) if m == "GET" and WEIGHTS in p})
    assert fetched == MODEL_FILES
    out = capsys.readouterr().out
    assert "downloading org/tiny@main: 0.0/16.4 MB (0%), 6 file(s)" in out
    assert re.search(r"downloaded org/tiny@main: 16\.4 MB in \d+s", out)
    model = AutoModelForCausalLM.from_pretrained(prepared.model_path)
    assert model.config.num_hidden_layers == 2
    assert AutoTokenizer.from_pretrained(prepared.model_path)("1 + 2")["input_ids"]

    mark = len(env.requests)
    again = prepare(parse_spec(spec_doc("org/tiny")))
    assert again.model_path == prepared.model_path
    assert since(env, mark) == [("GET", "/api/models/org/tiny")]  # where main points now; nothing downloaded
    assert "downloading" not in capsys.readouterr().out


def test_a_commit_in_the_cache_makes_no_request_and_a_branch_falls_back_to_it_offline(
    env: HubStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    path = resolve_model("org/tiny@main", report=lines.append)
    commit = path.name
    mark = len(env.requests)
    assert resolve_model(f"org/tiny@{commit}", report=lines.append) == path
    assert since(env, mark) == []

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the hub goes away
    assert resolve_model("org/tiny", report=lines.append) == path
    assert "the hub at http://127.0.0.1:9 is unreachable (ConnectError: " in lines[-1]
    assert lines[-1].endswith(f"using the cached snapshot {commit}")
    with pytest.raises(
        HubError,
        match=re.escape(
            "model.path org/gated@main: cannot reach the hub at http://127.0.0.1:9 (ConnectError: "
        ),
    ) as info:
        resolve_model("org/gated", report=lines.append)
    assert "or set HF_ENDPOINT (resources.env) to a mirror" in str(info.value)


def test_a_gated_model_without_a_token_is_refused_before_any_download(
    env: HubStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "rljob.dev/v1alpha1",
                "kind": "RLTrainingJob",
                "metadata": {"name": "gated"},
                "spec": spec_doc("org/gated"),
            }
        )
    )
    mark = len(env.requests)
    assert cli.main(["validate", "--config", str(config), "--prepare"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "rljob-runtime: invalid job: model.path org/gated@main is gated: set "
        "resources.secrets.huggingFaceToken to a Secret holding a token that has accepted its terms "
        f"({env.url}/org/gated)"
    )
    assert not any(WEIGHTS in p for _, p in since(env, mark))


def test_a_token_file_downloads_a_gated_model_and_bad_tokens_are_named(
    env: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "secret" / "token"
    token.parent.mkdir()
    monkeypatch.setenv(
        "HF_TOKEN_PATH", str(token)
    )  # as the operator mounts resources.secrets.huggingFaceToken

    token.write_text("hf_not_granted\n")
    with pytest.raises(
        HubError,
        match=re.escape(
            f"model.path org/gated@main is gated and the token from {token} "
            "(resources.secrets.huggingFaceToken) has no access to it: accept its terms at "
            f"{env.url}/org/gated"
        ),
    ):
        resolve_model("org/gated", report=lambda line: None)
    token.write_text("hf_revoked\n")
    with pytest.raises(
        HubError,
        match=re.escape(f"model.path org/gated@main: the hub at {env.url} refused the token from {token}"),
    ):
        resolve_model("org/gated", report=lambda line: None)

    token.write_text("hf_granted\n")
    prepared = prepare(parse_spec(spec_doc("org/gated")))
    assert sorted(p.name for p in Path(prepared.model_path).iterdir()) == MODEL_FILES


def test_unknown_repository_and_revision_are_named(env: HubStandIn) -> None:
    with pytest.raises(
        HubError,
        match=re.escape(
            f"model.path org/nope@main: no local directory of that name and no such repository on "
            f"{env.url}: check the id (Org/Name)"
        ),
    ):
        prepare(parse_spec(spec_doc("org/nope")))
    with pytest.raises(
        HubError, match=re.escape(f"model.path org/tiny@v9: org/tiny has no revision 'v9' on {env.url}")
    ):
        resolve_model("org/tiny@v9", report=lambda line: None)


def test_a_hub_tokenizer_fetches_no_weights(env: HubStandIn, model_dir: Path) -> None:
    mark = len(env.requests)
    prepare(parse_spec(spec_doc(str(model_dir), tokenizer="org/tiny")))
    fetched = {p.rsplit("/", 1)[1] for m, p in since(env, mark) if m == "GET" and WEIGHTS in p}
    assert "tokenizer.json" in fetched and "model.safetensors" not in fetched


def test_progress_lines_are_throttled_while_bytes_arrive(
    env: HubStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL_S", 0.3)
    monkeypatch.setattr(hub, "POLL_S", 0.05)
    env.seconds_per_mb = 0.1  # 16.4 MB in about 1.7 s
    lines: list[str] = []
    started = time.monotonic()
    resolve_model("org/tiny", report=lines.append)
    elapsed = time.monotonic() - started
    percents = [
        int(m.group(1))
        for line in lines
        if (m := re.fullmatch(r"downloading org/tiny@main: [\d.]+/16\.4 MB \((\d+)%\)", line))
    ]
    assert lines[0].startswith("downloading org/tiny@main: 0.0/16.4 MB (0%)")
    assert lines[-1].startswith("downloaded org/tiny@main: 16.4 MB in ")
    assert 2 <= len(percents) <= elapsed / 0.3 + 1, lines  # one per 0.3 s at most, not one per poll (0.05 s)
    assert percents == sorted(percents) and 0 < percents[-1] <= 100


def test_concurrent_processes_download_once(env: HubStandIn) -> None:
    env.seconds_per_mb = 0.25  # about 4 s: the second process starts while the first downloads
    code = (
        "import sys; from rljob_runtime.models.resolve import resolve_model; "
        "print(resolve_model(sys.argv[1]))"
    )
    mark = len(env.requests)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "org/tiny"], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len({o.strip().splitlines()[-1] for o in outputs}) == 1  # the same snapshot
    fetched = [p for m, p in since(env, mark) if m == "GET" and WEIGHTS in p]
    assert len(fetched) == len(MODEL_FILES)  # each file once
    assert sum("waiting for another process downloading org/tiny@main" in o for o in outputs) == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MB file system (tmpfs): mounting needs root, else the test is skipped."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_model_larger_than_the_free_cache_space_is_refused(
    env: HubStandIn, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(small_disk))
    mark = len(env.requests)
    with pytest.raises(
        HubError,
        match=re.escape(
            f"model.path org/tiny@main: no space left in the model cache {small_disk}/hub "
            "(16.4 MB to download, 4.2 MB free): give resources.modelCache a larger volume"
        ),
    ):
        resolve_model("org/tiny", report=lambda line: None)
    assert not any(WEIGHTS in p for _, p in since(env, mark))


def test_a_hub_critic_is_downloaded_by_prepare_and_the_ranks_find_it_in_the_cache(
    env: HubStandIn, tmp_path: Path
) -> None:
    from rljob_runtime.trainer.critic import critic_path

    spec = parse_spec(
        spec_doc(str(make_tiny_model(tmp_path / "policy", arch="llama", seed=1)))
        | {"algorithm": {"advantageEstimator": "ppo", "critic": {"path": "org/tiny"}}}
    )
    mark = len(env.requests)
    prepare(spec)
    assert any(p.endswith("/model.safetensors") for m, p in since(env, mark) if m == "GET")
    mark = len(env.requests)
    path = Path(critic_path(spec, "unused"))
    assert path.parent.parent == tmp_path / "hf" / "hub" / "models--org--tiny"
    assert not any(WEIGHTS in p for _, p in since(env, mark))  # the rank downloads nothing again

    gated = parse_spec(
        spec_doc("org/tiny") | {"algorithm": {"advantageEstimator": "ppo", "critic": {"path": "org/gated"}}}
    )
    with pytest.raises(HubError, match=r"^algorithm\.critic\.path org/gated@main is gated"):
        prepare(gated)
