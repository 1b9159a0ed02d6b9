"""The CPU-testable parts of ``benchmarks/gpu/weight_sync_path.py`` (the GPU runs are the owner's):
arguments, figures, the checksum comparison, the model shapes and the engine's model directory
(``sync_engine.py``), and the whole harness on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "weight_sync_path.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("weight_sync_path", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look the module up by name
    spec.loader.exec_module(module)
    return module


bench = _load()
import sync_engine  # noqa: E402  (the benchmark's sibling module: importable once it is loaded)


def test_arguments_defaults_and_per_transport_floors() -> None:
    args = bench.parse_args([])
    assert args.transport == "ipc" and args.models == ["0.5b", "1.5b", "4b"] and args.reps == 5
    assert args.floor_gbps == 1000 and args.target_gbps == 200
    assert args.bucket_bytes == 2 << 30  # the runtime's IPC buckets (cuda_ipc.IPC_BUCKET_BYTES)
    nccl = bench.parse_args(["--transport", "nccl", "--models", "4b, 0.5b", "--floor-gbps", "300"])
    assert nccl.models == ["4b", "0.5b"] and nccl.floor_gbps == 300 and nccl.target_gbps == 150
    assert nccl.bucket_bytes == 1 << 30
    assert bench.parse_args(["--bucket-mb", "64"]).bucket_bytes == 64 << 20
    assert bench.parse_args(["--tiny", "--models", "4b"]).models == ["tiny"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--models", "7b"],
        ["--models", ","],
        ["--reps", "0"],
        ["--cpu", "--transport", "ipc"],
        ["--bucket-mb", "0"],
    ],
)
def test_arguments_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_help_works_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--transport" in capsys.readouterr().out


def test_summary_is_the_median_after_the_warmup() -> None:
    runs = [
        {"convert_s": 9.0, "transfer_s": 9.0, "total_s": 10.0},  # warm-up: ignored
        {"convert_s": 0.1, "transfer_s": 0.3, "total_s": 0.5},
        {"convert_s": 0.3, "transfer_s": 0.1, "total_s": 0.4},
        {"convert_s": 0.2, "transfer_s": 0.2, "total_s": 0.6},
    ]
    out = bench.summarize(runs, size=8_000_000_000, floor_gbps=1000)
    assert out["convert_s"] == pytest.approx(0.2) and out["transfer_s"] == pytest.approx(0.2)
    assert out["total_s"] == pytest.approx(0.5) and out["reps"] == 3 and out["warmup_total_s"] == 10
    assert out["gb_per_s"] == pytest.approx(16.0)  # 8 GB / 0.5 s
    assert out["floor_s"] == pytest.approx(0.008) and out["x_floor"] == pytest.approx(62.5)
    with pytest.raises(ValueError):
        bench.summarize(runs[:1], size=1, floor_gbps=1)


def test_table_and_target_lines() -> None:
    runs = [{"pause_s": 0.001, "total_s": 0.05}] * 2
    result = {"model": "4b", "params": 4.0e9, "buckets": 8, **bench.summarize(runs, 8_000_000_000, 1000)}
    table = bench.format_table([result])
    assert "pause_ms" in table and "convert_ms" not in table and "160.0" in table  # GB/s
    (line,) = bench.target_lines([result, {**result, "model": "tiny"}], 200)
    assert line.endswith("MISSED")
    assert bench.target_lines([result], 150)[0].endswith("met")
    assert bench.target_lines([result], None) == []


def test_checksum_comparison() -> None:
    producer = {"a": (1, 2), "embed": (3, 4)}
    alias = {"lm_head": "embed"}
    assert bench.compare_checksums({"a": [1, 2], "embed": [3, 4], "lm_head": [3, 4]}, producer, alias) == []
    problems = bench.compare_checksums({"a": [1, 5], "lm_head": [3, 4], "extra": [0, 0]}, producer, alias)
    assert len(problems) == 3  # a differs, embed missing, extra never sent
    assert any("embed: not on the engine" in p for p in problems)
    assert any("extra: on the engine, never sent" in p for p in problems)


@pytest.mark.parametrize(("model", "billions"), [("0.5b", 0.49), ("1.5b", 1.54), ("4b", 4.02)])
def test_model_shapes_match_the_hf_model_and_the_converter(model: str, billions: float) -> None:
    """The hf engine's state_dict (built on the meta device) has the names and shapes a sync sends,
    plus the tied lm_head alias; the Megatron round trip gives back the same names."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rljob_runtime.trainer.megatron.convert import hf_to_megatron, megatron_to_hf
    from rljob_runtime.trainer.megatron.parallel import padded_vocab_size
    from rljob_runtime.trainer.megatron.testing import hf_shapes

    config = bench.qwen3_config(model)
    shape = bench.model_shape(config)
    with torch.device("meta"):
        engine = AutoModelForCausalLM.from_config(Qwen3Config(**config), dtype=torch.bfloat16)
    engine_shapes = {k: tuple(v.shape) for k, v in engine.state_dict().items()}
    sent = hf_shapes(shape)
    assert {k: v for k, v in engine_shapes.items() if k != "lm_head.weight"} == sent
    assert shape.tied_embeddings and "lm_head.weight" in engine_shapes
    assert sum(torch.Size(s).numel() for s in sent.values()) / 1e9 == pytest.approx(billions, abs=0.01)
    with torch.device("meta"):
        hf = {k: torch.empty(s, dtype=torch.bfloat16) for k, s in sent.items()}
        mg = hf_to_megatron(hf, shape, padded_vocab_size(shape.vocab_size, tp=1))
        assert set(megatron_to_hf(mg, shape)) == set(sent)


def test_tiny_model_directory_loads_in_the_hf_engine(tmp_path: Path) -> None:
    """The directory the server is started on: its weights load bit for bit, the tokenizer works,
    and a sync (Megatron layout -> HF) covers every engine tensor (tiny is untied, vocab padded)."""
    from rljob_runtime.rollout.hf_engine import HFEngine
    from rljob_runtime.sync.checksum import checksums
    from rljob_runtime.trainer.megatron.convert import hf_to_megatron
    from rljob_runtime.trainer.megatron.parallel import padded_vocab_size
    from rljob_runtime.trainer.megatron.testing import random_hf_state

    config = bench.qwen3_config("tiny")
    shape = bench.model_shape(config)
    weights = random_hf_state(shape, dtype=torch.bfloat16, seed=1)
    directory = sync_engine.write_model_dir(tmp_path / "tiny", config, weights)
    assert (directory / sync_engine.COMPLETE).is_file() and not list(tmp_path.glob(".tiny.*"))
    engine = HFEngine(directory, dtype="bfloat16", device="cpu")
    assert engine.encode("hello world") == [3, 4] and engine.pad_token_id == 1 and 2 in engine.eos_token_ids
    assert (
        bench.compare_checksums(checksums(engine.named_weights().items()), checksums(weights.items()), {})
        == []
    )

    state = hf_to_megatron(weights, shape, padded_vocab_size(shape.vocab_size, tp=1))
    assert state["embedding.word_embeddings.weight"].shape[0] == 1024  # 1000 padded
    bench.randomize_(state, seed=5)
    sent = bench.to_hf(state, shape, convert=True)
    assert set(sent) == set(engine.named_weights())
    assert engine.load_named_tensors(sent.items()) == len(sent)
    assert (
        bench.compare_checksums(checksums(engine.named_weights().items()), checksums(sent.items()), {}) == []
    )


def test_clock_phases_add_up_to_the_total() -> None:
    clock = bench.Clock(torch.device("cpu"))
    clock.mark("a_s")
    clock.mark("b_s")
    clock.mark("a_s")  # a phase met twice adds up
    out = clock.result()
    assert set(out) == {"a_s", "b_s", "total_s"}
    assert out["a_s"] + out["b_s"] == pytest.approx(out["total_s"])


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["tensors", "nccl"])
def test_the_whole_harness_on_cpu(tmp_path: Path, transport: str) -> None:
    """The script end to end against a real hf server on CPU (nccl: the same protocol over gloo):
    model directory, server start and stop, pause / flush / transfer / continue, checksums, JSON."""
    out = tmp_path / "out.json"
    argv = ["--cpu", "--transport", transport, "--tiny", "--reps", "1", "--bucket-mb", "0.5"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv, "--json", str(out), "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (result,) = data["results"]
    assert data["error"] is None and result["checksums_equal"] and len(result["runs"]) == 2
    assert result["buckets"] > 1 and result["bytes"] > 0 and result["gb_per_s"] > 0
    assert {"convert_s", "pause_s", "flush_s", "transfer_s", "continue_s"} <= set(result)
    assert ("init_s" in result) == (transport == "nccl")
    if transport == "tensors":  # the server's own phases, summed over the buckets, inside transfer
        server = [result[f"srv_{p}_s"] for p in ("queue", "decode", "copy", "sync", "release")]
        assert 0 < sum(server) <= result["transfer_s"]
