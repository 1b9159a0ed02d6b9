"""``rljob-runtime convert``: HF -> Megatron torch_dist -> HF returns the source tensors exactly (tied
Qwen3 in bfloat16, untied Llama with vocab padding in float32), transformers loads the result, ``verify``
names the first tensor that differs, and a failed conversion names the tensor or file and leaves no
``--out`` behind. CPU, one process (gloo); one test runs the real ``python -m`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.checkpoint_convert import Comparison, ConversionError, compare
from rljob_runtime.trainer.megatron.testing import LLAMA_UNTIED, QWEN3_0_6B, random_hf_state

REPO = Path(__file__).resolve().parents[2]

QWEN3_TIED: dict[str, Any] = {
    **QWEN3_0_6B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 250,
    "torch_dtype": "bfloat16",
}
LLAMA: dict[str, Any] = {
    **LLAMA_UNTIED,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "vocab_size": 203,
}


def write_model(dest: Path, config: dict[str, Any], dtype: torch.dtype = torch.float32) -> Path:
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config))
    (dest / "tokenizer_config.json").write_text("{}")
    state = {k: v.to(dtype) for k, v in random_hf_state(model_shape(config), seed=5).items()}
    save_file(state, str(dest / "model.safetensors"))
    return dest


# -------------------------------------------------------------------------------- pure: compare


def test_compare_reports_every_kind_of_difference_first_the_missing() -> None:
    source = {"a": torch.ones(2), "b": torch.zeros(3), "c": torch.ones(2, 2), "d": torch.ones(1)}
    converted = {
        "a": torch.ones(2, dtype=torch.bfloat16),
        "b": torch.ones(3),
        "c": torch.ones(4),
        "e": torch.ones(1),
    }
    result = compare(converted, source)
    assert result.mismatches() == [
        "d: missing in the conversion",
        "c: shape (4,) != source shape (2, 2)",
        "b: max abs diff 1 > 0",
        "e: not in the source",
    ]
    assert result.max_abs_diff["a"] == 0.0  # bf16 and fp32 holding the same value are equal
    assert compare(converted, source, atol=1.0, ignore=("c", "d", "e")).ok


def test_a_nan_is_a_mismatch() -> None:
    assert not compare({"x": torch.tensor([float("nan")])}, {"x": torch.tensor([0.0])}, atol=1e9).ok
    assert Comparison().ok


# ------------------------------------------------------------------------- conversions (CPU rank)


@pytest.fixture()
def cpu_rank(cpu_megatron: None) -> None:
    """This process as one gloo rank (conftest); the conversions reuse it."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "dtype"),
    [(QWEN3_TIED, torch.bfloat16), (LLAMA, torch.float32)],
    ids=["qwen3-tied-bf16", "llama-fp32"],
)
def test_hf_to_dist_to_hf_round_trip_is_exact(
    cpu_rank: None, tmp_path: Path, config: dict[str, Any], dtype: torch.dtype
) -> None:
    from rljob_runtime.trainer.megatron.checkpoint import is_dist_checkpoint, read_hf_state
    from rljob_runtime.trainer.megatron.checkpoint_convert import dist_to_hf, hf_to_dist, verify

    source = write_model(tmp_path / "hf", config, dtype)
    result = hf_to_dist(source, tmp_path / "dist", tp=2)  # the layout is only checked
    assert result.ok and len(result.max_abs_diff) == len(read_hf_state(source))
    assert is_dist_checkpoint(tmp_path / "dist")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    dist_to_hf(tmp_path / "dist", source, tmp_path / "out")
    back, want = read_hf_state(tmp_path / "out"), read_hf_state(source)
    assert sorted(back) == sorted(want)
    for name, tensor in want.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert (tmp_path / "out" / "config.json").is_file() and (
        tmp_path / "out" / "tokenizer_config.json"
    ).is_file()
    assert verify(tmp_path / "dist", source).ok and verify(tmp_path / "out", source).ok


@pytest.mark.slow
def test_transformers_loads_the_exported_directory(cpu_rank: None, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from rljob_runtime.trainer.megatron.checkpoint_convert import dist_to_hf, hf_to_dist

    source = write_model(tmp_path / "hf", LLAMA)
    hf_to_dist(source, tmp_path / "dist")
    dist_to_hf(tmp_path / "dist", source, tmp_path / "out")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    want = random_hf_state(model_shape(LLAMA), seed=5)
    got = model.state_dict()
    assert all(torch.equal(got[k], t) for k, t in want.items())


@pytest.mark.slow
def test_failed_conversions_name_the_tensor_and_leave_nothing(cpu_rank: None, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from rljob_runtime.trainer.megatron.checkpoint_convert import dist_to_hf, hf_to_dist, verify

    source = write_model(tmp_path / "hf", LLAMA)
    broken = write_model(tmp_path / "broken", LLAMA)
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"missing weight 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        hf_to_dist(broken, tmp_path / "never")
    assert not os.path.lexists(tmp_path / "never") and not list(tmp_path.glob(".never*"))
    with pytest.raises(ValueError, match="8 attention heads are not divisible by tensor parallel size 3"):
        hf_to_dist(source, tmp_path / "never", tp=3)

    hf_to_dist(source, tmp_path / "dist")
    with pytest.raises(ConversionError, match="exists"):
        hf_to_dist(source, tmp_path / "dist")
    # The config of another model: the first tensor that does not fit is named, with both shapes.
    wider = write_model(tmp_path / "wider", {**LLAMA, "intermediate_size": 128})
    with pytest.raises(
        ConversionError, match=r"tensor decoder\.layers\.mlp\.linear_fc\d\.weight .* has shape"
    ):
        dist_to_hf(tmp_path / "dist", wider, tmp_path / "never")
    assert not os.path.lexists(tmp_path / "never")

    # A shard file cut short (a copy interrupted, a full disk) is named with what .metadata needs.
    shard = sorted((tmp_path / "dist").glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(
        ConversionError, match=rf"damaged files: .*{shard.name} has 100 bytes, \.metadata needs"
    ):
        dist_to_hf(tmp_path / "dist", source, tmp_path / "never")
    hf_to_dist(source, tmp_path / "dist2")

    # verify names the tensor that differs.
    edited = write_model(tmp_path / "edited", LLAMA)
    state = load_file(str(edited / "model.safetensors"))
    state["model.layers.0.self_attn.k_proj.weight"][3, 1] += 0.5
    save_file(state, str(edited / "model.safetensors"))
    result = verify(tmp_path / "dist2", edited)
    assert result.mismatches() == ["model.layers.0.self_attn.k_proj.weight: max abs diff 0.5 > 0"]


# -------------------------------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_command_line(tmp_path: Path) -> None:
    """hf-to-dist in a process of its own (as a conversion Job runs it); verify and dist-to-hf through
    ``main`` in this one."""
    source = write_model(tmp_path / "hf", LLAMA)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("runtime", "api"))}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rljob_runtime.convert_cli",
            "hf-to-dist",
            "--model",
            str(source),
            "--out",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 mismatches" in done.stdout


@pytest.mark.slow
def test_main_verify_exit_status(cpu_rank: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    from rljob_runtime.convert_cli import main

    source = write_model(tmp_path / "hf", LLAMA)
    assert main(["hf-to-dist", "--model", str(source), "--out", str(tmp_path / "dist")]) == 0
    assert (
        main(
            [
                "dist-to-hf",
                "--checkpoint",
                str(tmp_path / "dist"),
                "--model",
                str(source),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert main(["verify", "--checkpoint", str(tmp_path / "out"), "--model", str(source)]) == 0
    state = load_file(str(tmp_path / "out" / "model.safetensors"))
    state["model.norm.weight"][0] += 1.0
    save_file(state, str(tmp_path / "out" / "model.safetensors"))
    capsys.readouterr()
    assert main(["verify", "--checkpoint", str(tmp_path / "out"), "--model", str(source)]) == 1
    assert "model.norm.weight: max abs diff 1 > 0" in capsys.readouterr().err
    assert (
        main(
            [
                "dist-to-hf",
                "--checkpoint",
                str(tmp_path / "hf"),
                "--model",
                str(source),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 1
    )
    assert "no Megatron distributed checkpoint" in capsys.readouterr().err
