"""Expert parallelism on 2 GPUs: the megatron trainer rank on a random Qwen3-MoE (Qwen3-30B-A3B's shape
scaled down: 4 layers, hidden 512, 16 experts, top 4, expert FFN 256; bf16) at expert parallel size 1
and 2, data parallel 2 either way, megatron-core's alltoall token dispatcher (torchrun worker:
megatron_ep_worker.py). Each layout runs GRPO steps on the same 8 samples.

Checks: EP 2 gives EP 1's first-step log-probs, loss and grad norm (bf16 tolerance) and, after the
same steps, the same exported HF weights under the same names; the step time and MFU of each layout
are printed and written to $RLJOB_RESULTS_DIR when set. MFU: model FLOPs per token = 10 x the
parameters a token passes through (attention, its top k experts and the router, the LM head): 6 for
the training pass, 2 each for the policy's and the reference's log-prob passes of the step;
attention's s x s products left out; padded tokens counted, as benchmarks/gpu/megatron_mfu.py does.
Skipped with fewer than 2 GPUs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

sys.path.insert(0, str(Path(__file__).parent))
from megatron_backend_case import CONFIG
from sglang_case import results_file
from test_megatron_moe_gpu import SHAPE

WORKER = Path(__file__).parent / "megatron_ep_worker.py"
REPO = Path(__file__).resolve().parents[2]
STEPS = 4
PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16, as benchmarks/gpu/megatron_mfu.py


def write_moe(dest: Path) -> Path:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=CONFIG["vocab_size"], **SHAPE))
    model.to(torch.bfloat16).save_pretrained(dest)
    return dest


def active_flops_per_token(config: dict[str, Any]) -> float:
    from rljob_runtime.trainer.megatron import model_shape

    shape = model_shape(config)
    moe = shape.moe
    assert moe is not None
    h = shape.hidden_size
    attention = 2 * h * shape.q_size + 2 * h * shape.kv_size
    experts = moe.top_k * 3 * h * moe.expert_ffn_hidden_size + moe.num_experts * h
    return 10.0 * (shape.num_layers * (attention + experts) + shape.vocab_size * h)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if torch.cuda.device_count() < 2:
        pytest.skip("expert parallelism needs 2 GPUs")
    model_dir = write_moe(tmp_path_factory.mktemp("qwen3-moe") / "model")
    out = tmp_path_factory.mktemp("ep") / "results.pt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "runtime"), str(REPO / "api"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.run(
        [*cmd, str(WORKER), str(model_dir), str(out), "ep1,ep2", str(STEPS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(proc.stdout)
    if proc.returncode:
        pytest.fail(f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}")
    got: list[dict[str, Any]] = torch.load(out, weights_only=False)
    flops = active_flops_per_token(json.loads((model_dir / "config.json").read_text()))
    rows = []
    for r in got:
        step_s = sorted(r["step_s"][1:])[len(r["step_s"][1:]) // 2]  # median after the first (compiles)
        mfu = flops * r["padded_tokens"] / step_s / (2 * PEAK_TFLOPS * 1e12)
        rows.append(
            {"ep": r["ep"], "dispatcher": r["dispatcher"], "step_s": round(step_s, 4), "mfu": round(mfu, 4)}
            | {"peak_gib": round(r["peak_gib"], 2), "metrics": r["metrics"]}
        )
        print("megatron-ep", json.dumps(rows[-1]), flush=True)
    results_file("megatron-ep", {"rows": rows})
    return got


def test_both_layouts_ran_with_the_alltoall_dispatcher(results: list[dict[str, Any]]) -> None:
    assert [r["ep"] for r in results] == [1, 2]
    assert all(r["dispatcher"] == "alltoall" for r in results)


def test_expert_parallel_2_trains_as_1(results: list[dict[str, Any]]) -> None:
    ep1, ep2 = results
    torch.testing.assert_close(ep2["logp"], ep1["logp"], rtol=2e-2, atol=2e-2)
    for key in ("loss", "pg_loss", "grad_norm"):
        assert ep2["metrics"][key] == pytest.approx(ep1["metrics"][key], rel=5e-2, abs=1e-4), key
    assert sorted(ep2["named"]) == sorted(ep1["named"]) and ep1["named"]
    worst = max(float((ep2["named"][k] - ep1["named"][k]).abs().max()) for k in ep1["named"])
    assert worst < 2e-2, worst
