"""Scaled-down copies of the GPU examples run through the runtime: each manifest's spec with only
its size changed (SmolLM2-135M and the demo's addition data, one GPU or one trainer + one engine
GPU, tensor parallel 1, 2 steps of 4 prompts x 4 samples, 64-token responses, a local checkpoint
path, no pod-only settings); its engine (SGLang), backend, placement mode, algorithm, reward and
async settings stay the manifest's."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from learning import REPO
from sglang_case import KIT_ARGS, results_file, smollm2

from rljob_api.resource import parse_spec

EXAMPLES = {"grpo-job.yaml": 1, "grpo-disaggregated.yaml": 2, "grpo-async.yaml": 2}


def scaled(name: str, tmp_path: Path) -> dict[str, Any]:
    spec = copy.deepcopy(yaml.safe_load((REPO / "examples" / "manifests" / name).read_text())["spec"])
    spec["model"] = {"path": smollm2(), "dtype": "bfloat16"}
    spec["data"] = {"path": str(REPO / "examples/data/add-1digit.jsonl"), "applyChatTemplate": True}
    rollout = spec.setdefault("rollout", {})
    rollout.update(batchSize=4, nSamplesPerPrompt=4, maxResponseLen=64)
    rollout["sglangArgs"] = {**rollout.get("sglangArgs", {}), **KIT_ARGS}
    training = spec.setdefault("training", {})
    training.update(numRollout=2, globalBatchSize=16, microBatchSize=1, parallelism={"tensor": 1})
    resources = spec["resources"]
    resources["trainer"] = {"nodes": 1, "gpusPerNode": 1}
    resources["rollout"] = {"gpusPerEngine": 1} | (
        {} if resources.get("colocate", True) else {"gpus": 1, "gpusPerNode": 1}
    )
    for pod_only in ("nodeSelector", "tolerations", "secrets"):
        resources.pop(pod_only, None)
    spec["checkpoint"] = {"path": str(tmp_path / "ckpt"), "saveInterval": 2}
    return spec


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_scaled_down_example_runs(name: str, tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() < EXAMPLES[name]:
        pytest.skip(f"{name} scaled down needs {EXAMPLES[name]} GPUs")
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    doc = scaled(name, tmp_path)
    result = run(prepare(parse_spec(doc)), RunOptions())
    rows = [
        {k: round(v, 4) for k, v in h.items() if k.startswith(("reward/", "time/", "sync/"))}
        for h in result.history
    ]
    print(name, json.dumps(rows), flush=True)
    results_file(f"example-{name.removesuffix('.yaml')}", {"spec": doc, "rows": rows})
    assert result.steps_done == 2 and result.last_checkpoint
