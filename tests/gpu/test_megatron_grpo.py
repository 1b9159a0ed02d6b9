"""GRPO with the megatron backend on one GPU, through the runtime's driver (prepare / run): the CPU
demo's config (tests/learning.py demo_spec: SmolLM2-135M-Instruct, single-digit addition, 8 prompts
x 4 samples, 10 steps) with training.backend megatron, resources.device cuda, the hf engine on the
same GPU (colocated) and weights pushed through a safetensors file in /dev/shm. The mean reward
must rise by tests/learning.py's criterion; then a second run resumes from the last checkpoint.

``test_driver_loop_with_a_tiny_model`` is the same loop on a random 2-layer model in bfloat16 (no
learning expected): quick, and it needs only SmolLM2's tokenizer. Seeds: RLJOB_GRPO_SEEDS (default "1").
Per-step numbers go to stdout and, when RLJOB_RESULTS_DIR is set, to a JSON file there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from learning import demo_spec, learned

pytest.importorskip("megatron.core")
pytest.importorskip("ray")

from rljob_api.resource import parse_spec

SEEDS = [int(s) for s in os.environ.get("RLJOB_GRPO_SEEDS", "1").split(",")]
KEYS = ("reward/mean", "response_length/mean", "time/step", "time/generate", "time/train", "time/sync")


def _megatron(doc: dict[str, Any], steps: int | None = None) -> dict[str, Any]:
    doc["training"]["backend"] = "megatron"
    if steps:
        doc["training"]["numRollout"] = steps
    doc["resources"]["device"] = "cuda"
    doc["resources"]["trainer"] = {"nodes": 1, "gpusPerNode": 1}
    return doc


def _run(doc: dict[str, Any]) -> Any:
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    return run(prepare(parse_spec(doc)), RunOptions())


def _report(name: str, history: list[dict[str, float]]) -> list[dict[str, float]]:
    rows = [{k: round(float(h.get(k, float("nan"))), 4) for k in ("step", *KEYS)} for h in history]
    for row in rows:
        print(name, json.dumps(row), flush=True)
    out = os.environ.get("RLJOB_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return rows


def test_driver_loop_with_a_tiny_model(tmp_path: Path) -> None:
    from rljob_runtime.models.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", arch="llama", seed=0)
    doc = _megatron(demo_spec("grpo", 1, tmp_path / "ckpt", steps=2))
    doc["model"]["path"] = str(model)
    doc["model"]["dtype"] = "bfloat16"  # the learning run below is float32 like the CPU demo
    doc["rollout"]["maxResponseLen"] = 16
    first = _run(doc)
    _report("tiny", first.history)
    assert first.steps_done == 2 and first.last_checkpoint and first.last_checkpoint.endswith("iter_0000002")
    assert (Path(first.last_checkpoint) / "model" / "model.safetensors").is_file()
    resumed = _run(_megatron(doc, steps=3))  # resume auto: loads iter_0000002, runs step 3
    assert resumed.steps_done == 3 and len(resumed.history) == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_megatron_grpo_learns(seed: int, tmp_path: Path) -> None:
    from rljob_runtime.models.errors import ModelNotFoundError
    from rljob_runtime.models.resolve import resolve_model

    doc = _megatron(demo_spec("grpo", seed, tmp_path / "ckpt"))
    try:
        resolve_model(doc["model"]["path"])
    except ModelNotFoundError as err:
        pytest.skip(f"SmolLM2-135M-Instruct is not available offline here: {err}")
    result = _run(doc)
    rows = _report(f"grpo-seed{seed}", result.history)
    assert result.steps_done == doc["training"]["numRollout"]
    ok, why = learned([r["reward/mean"] for r in rows])
    print(f"seed {seed}: {why}")
    assert ok, why
    # The checkpoint of the last step is a loadable HF model; a longer run resumes from it.
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(Path(result.last_checkpoint) / "model"))
    steps = doc["training"]["numRollout"]
    resumed = _run(_megatron(doc, steps=steps + 1))
    assert resumed.steps_done == steps + 1 and len(resumed.history) == 1
    _report(f"grpo-seed{seed}-resumed", resumed.history)
