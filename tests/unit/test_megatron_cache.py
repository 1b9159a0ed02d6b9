"""``megatron_cache`` and ``rljob-runtime convert megatron-cache``: the cache key of a model
(a hub snapshot by its commit, a local directory by its weight files and config), one conversion per
key under a file lock, reused without touching a file, an interrupted one replaced, and a failure's
last line. The conversions run on CPU in this process (gloo, conftest's ``cpu_megatron``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_convert_cli import LLAMA, write_model

from rljob_runtime.convert_cli import main
from rljob_runtime.models import megatron_cache as cache
from rljob_runtime.models.cache import file_lock, lock_path


@pytest.fixture()
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RLJOB_CACHE", str(root))
    return root


def run_main(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """``main`` with its stdout and stderr lines (usable at module scope, unlike capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def tree_stat(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of ``root`` and everything under it."""
    paths = [root, *root.rglob("*")]
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in paths}


# ----------------------------------------------------------------------------------- pure: keys


def test_cache_root_is_the_pods_model_cache_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLJOB_CACHE", raising=False)
    assert cache.cache_root() == Path("/var/cache/rljob/rljob")
    monkeypatch.setenv("RLJOB_CACHE", "/elsewhere")
    assert cache.cache_root() == Path("/elsewhere")


def test_a_hub_snapshot_is_named_by_repository_and_commit(tmp_path: Path, cache_env: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots" / commit
    snapshot.mkdir(parents=True)  # no files read: the commit names them
    assert cache.source_key(snapshot) == f"Qwen--Qwen3-0.6B@{commit}"
    assert cache.converted_dir(snapshot) == cache_env / "megatron" / f"Qwen--Qwen3-0.6B@{commit}"
    # A directory called snapshots elsewhere is a local directory.
    other = tmp_path / "mine/snapshots/v1"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    assert cache.source_key(other).startswith("v1-")


def test_a_local_directory_key_follows_its_weights_and_config(tmp_path: Path) -> None:
    model = tmp_path / "my model+v2"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "tokenizer.json").write_text("{}")
    weights = model / "model.safetensors"
    weights.write_bytes(b"x" * 10)
    first = cache.source_key(model)
    assert first.startswith("my_model_v2-") and len(first.split("-")[-1]) == 16
    assert cache.source_key(model) == first
    (tmp_path / "link").symlink_to(model)
    assert cache.source_key(tmp_path / "link") == first  # the directory's real path
    (model / "tokenizer.json").write_text('{"changed": true}')
    assert cache.source_key(model) == first  # not a weight file

    keys = {first}
    weights.write_bytes(b"y" * 11)  # replaced: another size
    keys.add(cache.source_key(model))
    os.utime(weights, ns=(1, 2_000_000_000))  # replaced: same size, another mtime
    keys.add(cache.source_key(model))
    (model / "pytorch_model.bin").write_bytes(b"z")  # another weight file
    keys.add(cache.source_key(model))
    (model / "config.json").write_text('{"a": 2}')
    keys.add(cache.source_key(model))
    shutil.copytree(model, tmp_path / "copy" / "my model+v2")  # the same files elsewhere
    keys.add(cache.source_key(tmp_path / "copy" / "my model+v2"))
    assert len(keys) == 6


def test_only_a_directory_with_its_record_is_converted(tmp_path: Path) -> None:
    directory = tmp_path / "k"
    directory.mkdir()
    (directory / "metadata.json").write_text("{}")
    assert not cache.is_converted(directory) and not cache.is_converted(tmp_path / "missing")
    (directory / cache.RECORD).write_text("{not json")
    assert not cache.is_converted(directory)
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    cache.write_record(directory, cache.make_record(source, "3 tensors compared", model="Org/Name"))
    assert cache.is_converted(directory)
    record = cache.read_record(directory)
    assert record is not None
    assert {k: record[k] for k in ("source", "model", "key", "comparison")} == {
        "source": str(source),
        "model": "Org/Name",
        "key": cache.source_key(source),
        "comparison": "3 tensors compared",
    }


# ----------------------------------------------------------------- megatron-cache: no conversion


def test_a_model_that_does_not_resolve_fails_with_one_line(
    tmp_path: Path, cache_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["megatron-cache", "--model", str(tmp_path / "nowhere")]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"conversion failed: model.path '{tmp_path / 'nowhere'}': no such local directory")
    assert not cache_env.exists()


def test_a_layout_that_does_not_fit_is_refused_before_any_lock(
    tmp_path: Path, cache_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_model(tmp_path / "hf", LLAMA)
    assert main(["megatron-cache", "--model", str(model), "--tp", "3"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("conversion failed: ") and "not divisible by tensor parallel size 3" in last
    assert not cache_env.exists()


def test_a_second_job_waits_for_the_first_and_reuses_its_conversion(tmp_path: Path, cache_env: Path) -> None:
    """Two jobs of one model at once: the second waits on the lock, then finds the first one's result."""
    model = write_model(tmp_path / "hf", LLAMA)
    target = cache.converted_dir(model)
    results: list[tuple[int, list[str], list[str]]] = []
    argv = ["megatron-cache", "--model", str(model)]
    with file_lock(lock_path(target)):  # the first job, converting
        waiter = threading.Thread(target=lambda: results.append(run_main(argv)))
        waiter.start()
        time.sleep(1.0)
        assert not results  # still waiting
        target.mkdir(parents=True)
        (target / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
        cache.write_record(target, cache.make_record(model, "1 tensors compared"))
    waiter.join(timeout=60)
    code, out, _ = results[0]
    converted_at = cache.read_record(target)["converted_at"]  # type: ignore[index]
    assert code == 0
    assert out == [
        f"waiting for another job converting {model.resolve()} into {target}",
        f"reused {target} (converted {converted_at})",
    ]


# ------------------------------------------------------------- megatron-cache: real conversions


@pytest.fixture(scope="module")
def first_conversion(cpu_megatron: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One conversion into an empty cache, over what an interrupted one left: a directory without its
    record and a staging directory."""
    base = tmp_path_factory.mktemp("megatron-cache")
    model = write_model(base / "hf", LLAMA).resolve()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLJOB_CACHE", str(base / "cache"))
        target = cache.converted_dir(model)
        target.mkdir(parents=True)
        (target / "__0_0.distcp").write_bytes(b"half written")
        stale = target.parent / f".{target.name}.tmp-12345"
        stale.mkdir()
        code, out, err = run_main(["megatron-cache", "--model", str(model)])
    return {"base": base, "model": model, "target": target, "code": code, "out": out, "err": err}


@pytest.mark.slow
def test_megatron_cache_converts_over_a_partial_one_then_reuses_it_untouched(
    first_conversion: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rljob_runtime.trainer.megatron.checkpoint_convert import verify

    model, target = first_conversion["model"], first_conversion["target"]
    assert first_conversion["code"] == 0, first_conversion["err"]
    out = first_conversion["out"]
    assert out[:2] == [
        f"removing an incomplete conversion: {target}",
        f"removing an incomplete conversion: {target.parent / f'.{target.name}.tmp-12345'}",
    ]
    record = cache.read_record(target)
    assert record is not None and record["key"] == target.name and record["source"] == str(model)
    assert out[-1] == f"converted {model} -> {target}: {record['comparison']}"
    assert record["comparison"].endswith("0 mismatches (atol 0)")
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, f".{target.name}.lock"])
    assert b"half written" not in [p.read_bytes() for p in target.glob("*.distcp")]
    assert verify(target, model).ok

    before = tree_stat(target)
    monkeypatch.setenv("RLJOB_CACHE", str(first_conversion["base"] / "cache"))
    code, out, _ = run_main(["megatron-cache", "--model", str(model), "--tp", "2"])
    assert (code, out) == (0, [f"reused {target} (converted {record['converted_at']})"])
    assert tree_stat(target) == before


@pytest.mark.slow
def test_a_failed_conversion_ends_with_one_line_naming_the_tensor(
    cpu_megatron: None, tmp_path: Path, cache_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file

    broken = write_model(tmp_path / "broken", LLAMA)
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(broken / "model.safetensors"))
    assert main(["megatron-cache", "--model", str(broken)]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("conversion failed: ")
    assert "missing weight 'model.layers.1.mlp.up_proj.weight'" in last
    target = cache.converted_dir(broken)
    assert sorted(p.name for p in target.parent.iterdir()) == [f".{target.name}.lock"]  # nothing else
