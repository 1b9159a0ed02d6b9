"""A job's megatron fields on a GPU: one short GRPO job (2 steps of the CPU demo's task, SmolLM2-135M-
Instruct in bf16) on the megatron backend colocated with a stock SGLang engine on one GPU, with every
fusion of training.fusions, the chunked LM head (training.lmHead) and a training.megatronArgs option
(check-for-nan-in-loss-and-grad: each gradient bucket's norm checked before its reduce, so a NaN
gradient from the fused or chunked paths would fail the run), the KL loss (the reference model's
chunked head) and an entropy bonus (the head's entropy gradient). It must finish its steps with finite
losses, gradient norms and entropies and a reward; each step's time is printed as it ends and written
to $RLJOB_RESULTS_DIR when set. The first step includes the fusions' compiles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sglang_case import results_file, sglang_job

from rljob_api.resource import parse_spec

STEPS = 2
FIELDS = {
    "fusions": ["swiglu", "wgrad", "norm", "rope"],
    "lmHead": "chunked",
    "megatronArgs": {"check-for-nan-in-loss-and-grad": ""},
}
KEYS = ("reward/mean", "train/loss", "train/entropy", "train/grad_norm", "train/ppo_kl", "train/kl_loss")


@pytest.mark.gpu
def test_fusions_chunked_head_and_megatron_args_run_a_colocated_grpo_job(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare
    from rljob_runtime.trainer.megatron.policy import model_options

    doc = sglang_job(tmp_path, backend="megatron", steps=STEPS)
    doc["training"].update(FIELDS)
    doc["algorithm"].update({"useKLLoss": True, "klLossCoef": 0.01, "entropyCoef": 0.001})
    spec = parse_spec(doc)
    # What the trainer ranks build from this spec (they are Ray actors: the same function, there).
    options = model_options(spec)
    assert options.fusions == set(FIELDS["fusions"]) and options.chunked_head
    assert options.megatron.ddp == {"check_for_nan_in_grad": True}

    rows: list[dict[str, float]] = []

    def on_step(metrics: dict[str, float]) -> None:
        row = {k: round(float(v), 4) for k, v in metrics.items() if k in KEYS or k.startswith("time/")}
        rows.append(row)
        print("megatron-job-fields", json.dumps(row), flush=True)  # as it ends: a cut run still tells

    result = run(prepare(spec), RunOptions(on_step=on_step))
    results_file("megatron-job-fields", {"fields": FIELDS, "rows": rows})
    for row in rows:
        print(f"megatron-job-fields step {row.get('time/step', float('nan')):.1f} s", flush=True)

    assert result.steps_done == STEPS and len(result.history) == STEPS
    for h in result.history:
        for key in ("train/loss", "train/grad_norm", "train/entropy", "train/kl_loss", "reward/mean"):
            assert key in h and math.isfinite(h[key]), (key, h.get(key))
        assert 0.0 <= h["reward/mean"] <= 1.0
        assert h["train/entropy"] > 0.0  # the chunked head's entropy of a real softmax
        assert h["train/grad_norm"] > 0.0  # something was trained
        assert h["time/step"] > 0.0
    # The first step's log-probs come from the same weights the samples were drawn with.
    assert abs(result.history[0]["train/ppo_kl"]) < 1e-2, result.history[0]["train/ppo_kl"]
