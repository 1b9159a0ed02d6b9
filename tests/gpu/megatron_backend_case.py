"""The case shared by tests/gpu/test_megatron_backend.py and its torchrun worker: a random-weight
Qwen3-style model (4 layers, tied, a vocab that needs padding), a spec and 8 samples."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.data.sample import Sample
from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B, random_hf_state, with_layers

CONFIG = with_layers(QWEN3_0_6B, 4, vocab_size=32003)
# Asymmetric, so the first step's pg_loss is not 0 by symmetry.
ADV = torch.tensor([1.0, -0.5, 0.3, -1.0, 2.0, -1.0, 0.5, -0.2])


def write_model(dest: Path) -> Path:
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(CONFIG))
    save_file(random_hf_state(model_shape(CONFIG), seed=11), str(dest / "model.safetensors"))
    return dest


def make_spec(
    model_dir: str, *, backend: str = "megatron", tp: int = 1, pp: int = 1, dtype: str = "bfloat16"
) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model_dir), "dtype": dtype},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {"useKLLoss": True, "klLossCoef": 0.01, "lossReduction": "token"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4, "temperature": 0.8},
            "training": {
                "backend": backend,
                "globalBatchSize": 8,
                "microBatchSize": 2,
                "parallelism": {"tensor": tp, "pipeline": pp},
                "optimizer": {"lr": 1e-4, "clipGrad": 1.0},
            },
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 2}},
        }
    )


def make_samples(seed: int = 0) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    vocab = CONFIG["vocab_size"]
    out = []
    for i in range(8):
        prompt = torch.randint(0, vocab, (5 + 3 * i,), generator=gen).tolist()
        response = torch.randint(0, vocab, (10 + 4 * i,), generator=gen).tolist()
        mask = [1] * len(response)
        if i == 3:
            mask[2:5] = [0, 0, 0]  # e.g. a tool output inside the response
        out.append(Sample(group_index=i // 4, prompt_ids=prompt, response_ids=response, loss_mask=mask))
    return out
