"""The ppo critic of the megatron backend on a GPU: the CPU demo's task (SmolLM2-135M-Instruct, bf16)
with advantageEstimator ppo, megatron trainer and a stock SGLang engine colocated on one GPU. A first
run trains one step and saves (the critic beside the policy in the checkpoint), a second resumes from
it for the next: both steps train the critic (finite value loss, its optimizer step taken). Each
step's row is printed as it ends and written to $RLJOB_RESULTS_DIR when set."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sglang_case import results_file, sglang_job

from rljob_api.resource import parse_spec

KEYS = ("reward/mean", "train/value_loss", "train/value_clipfrac", "train/value_mean", "train/ppo_kl")


@pytest.mark.gpu
def test_a_ppo_job_trains_its_megatron_critic_saves_it_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    from rljob_runtime.checkpoint import store
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    doc = sglang_job(tmp_path, backend="megatron", steps=2)
    doc["algorithm"].update({"advantageEstimator": "ppo", "critic": {"lr": 1e-5}})
    doc["checkpoint"]["saveInterval"] = 1
    spec = parse_spec(doc)
    rows: list[dict[str, float]] = []

    def on_step(metrics: dict[str, float]) -> None:  # as it ends: a run cut short still tells
        row = {
            k: round(float(v), 5)
            for k, v in metrics.items()
            if k in KEYS or k.startswith(("time/", "train/critic"))
        }
        rows.append({"step": metrics["step"], **row})
        print("megatron-critic", json.dumps(rows[-1]), flush=True)

    first = run(prepare(spec), RunOptions(on_step=on_step, stop_after=1))
    ckpt = Path(spec.checkpoint.path)
    assert first.steps_done == 1
    assert (store.iteration_dir(ckpt, 1) / "critic" / "metadata.json").is_file()
    rest = run(prepare(spec), RunOptions(on_step=on_step))
    results_file("megatron-critic", {"rows": rows})

    assert rest.steps_done == 2 and len(rest.history) == 1 and rest.history[0]["step"] == 2
    for h in first.history + rest.history:
        for key in ("train/value_loss", "train/value_clipfrac", "train/critic_grad_norm", "train/pg_loss"):
            assert math.isfinite(h[key]), (key, h[key])
        assert h["train/value_loss"] > 0 and h["train/critic_skipped_step"] == 0.0
    assert first.history[0]["train/value_clipfrac"] == 0.0  # V = 0 at the start: nothing clipped yet
    assert abs(first.history[0]["train/ppo_kl"]) < 1e-3  # the first step is on-policy
