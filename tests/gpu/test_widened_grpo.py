"""A ~2B model learns with GRPO on megatron + SGLang, colocated on one GPU.

The model is SmolLM2-135M-Instruct widened without changing its function
(``rljob_runtime.models.widen``: 2304 hidden, 36 query and 12 KV heads, 6912 MLP neurons, 30 layers,
1.97B parameters), so a GPU host without network gets a large model that starts where the demo's
does; it must then learn the demo's task (single-digit addition) by the project's criterion over 20
steps. Per-step rows (reward, time and GPU memory of each phase) are printed and written to
$RLJOB_RESULTS_DIR when set.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from learning import learned
from sglang_case import results_file, sglang_job

from rljob_api.resource import parse_spec

WIDE = {"hidden_size": 2304, "num_attention_heads": 36, "num_key_value_heads": 12, "intermediate_size": 6912}
STEPS = 20
PHASE_KEYS = ("reward/mean", "response_length/mean", "train/ppo_kl", "sync/gb_per_s")


@pytest.mark.gpu
def test_a_widened_2b_smollm2_learns_colocated_on_megatron_and_sglang(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    import torch

    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.models.smollm2 import smollm2_dir
    from rljob_runtime.models.widen import widen_checkpoint
    from rljob_runtime.prepare import prepare

    t0 = time.monotonic()
    widened = widen_checkpoint(smollm2_dir(), tmp_path / "smollm2-2b", dtype=torch.bfloat16, **WIDE)
    print(
        f"widened {widened.source_params:,} -> {widened.target_params:,} parameters in {time.monotonic() - t0:.0f} s"
    )
    assert widened.target_params > 1.5e9

    doc = sglang_job(tmp_path, backend="megatron", steps=STEPS)
    doc["model"]["path"] = str(widened.path)
    result = run(prepare(parse_spec(doc)), RunOptions())

    rows = [
        {k: round(float(v), 4) for k, v in h.items() if k in PHASE_KEYS or k.startswith(("memory/", "time/"))}
        for h in result.history
    ]
    for row in rows:
        print("widened-2b", json.dumps(row), flush=True)
    rewards = [h["reward/mean"] for h in result.history]
    ok, why = learned(rewards)
    print(f"widened-2b learned: {ok}: {why}", flush=True)
    results_file(
        "grpo-widened-2b", {"params": widened.target_params, "rows": rows, "learned": ok, "why": why}
    )
    assert result.steps_done == STEPS
    assert ok, why
