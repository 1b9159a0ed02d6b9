"""A ~2B model learns with GRPO on megatron + SGLang, colocated on one GPU.

The model is SmolLM2-135M-Instruct widened without changing its function
(``rljob_runtime.models.widen``: 2304 hidden, 36 query and 12 KV heads, 6912 MLP neurons, 30 layers,
1.97B parameters), so a GPU host without network gets a large model that starts where the demo's
does; it must then learn the demo's task (single-digit addition) by the project's criterion over 20
steps, at the demo's learning rate scaled to the width (LR). Per-step rows (reward, time and GPU memory of each phase) are printed and written to
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
# The demo's 3e-5 scaled by the width ratio (576 / 2304), as muP scales Adam's rate for hidden
# matrices: every new column and row of the widened model moves by about the rate per step too, so at
# the demo's rate one step would change the function about four times as much. Rounded up to 1e-5.
LR = 1e-5
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

    # One step more than it trains, stopped before it: no final save (a 1.97B with its Adam state is 32
    # GB to write, a minute this test does not need; the resume tests cover saving).
    doc = sglang_job(tmp_path, backend="megatron", steps=STEPS + 1)
    doc["model"]["path"] = str(widened.path)
    doc["training"]["optimizer"]["lr"] = LR
    rows: list[dict[str, float]] = []

    def each_step(metrics: dict[str, float]) -> None:  # printed as it ends: a run cut short still tells
        keep = {k: v for k, v in metrics.items() if k in PHASE_KEYS or k.startswith(("memory/", "time/"))}
        rows.append(
            {"step": metrics.get("step", len(rows) + 1), **{k: round(float(v), 4) for k, v in keep.items()}}
        )
        print("widened-2b", json.dumps(rows[-1]), flush=True)

    result = run(prepare(parse_spec(doc)), RunOptions(on_step=each_step, stop_after=STEPS))
    rewards = [h["reward/mean"] for h in result.history]
    ok, why = learned(rewards)
    print(f"widened-2b learned: {ok}: {why}", flush=True)
    results_file(
        "grpo-widened-2b", {"params": widened.target_params, "rows": rows, "learned": ok, "why": why}
    )
    assert result.steps_done == STEPS
    assert ok, why
