"""A Qwen3-MoE on one GPU: GRPO through the runtime's driver, megatron trainer and a stock SGLang
engine colocated (expert parallel size 1). The model is Qwen3-30B-A3B's shape scaled down (4 layers,
hidden 512, 16 experts, top 4, expert FFN 256) with random weights and SmolLM2's tokenizer, written by
transformers as a checkpoint is on disk (per-expert names).

- every step trains the router and the experts (the entropy bonus: a random model earns no reward)
  and pushes them into SGLang: after each sync, the
  engine's greedy tokens equal a fresh SGLang server's loaded from the trainer's exported weights
  (HF names, every expert once), and those weights moved;
- the first step is on-policy (the trainer's log-probs match the engine's weights);
- the final checkpoint holds the MoE's HF export.

Each step's row is printed as it ends and written to $RLJOB_RESULTS_DIR when set."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sglang_case import (
    KIT_ARGS,
    export_dir,
    fresh_server_tokens,
    greedy,
    http,
    results_file,
    sglang_job,
    smollm2,
)

from rljob_api.resource import parse_spec

# Qwen3-30B-A3B: 48 layers, hidden 2048, 32/4 heads of 128, 128 experts, top 8, expert FFN 768
SHAPE = {
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}
KEYS = (
    "reward/mean",
    "train/ppo_kl",
    "train/grad_norm",
    "time/step",
    "time/generate",
    "time/train",
    "time/sync",
)


def random_qwen3_moe(dest: Path) -> Path:
    """A random-weight Qwen3-MoE checkpoint (bf16) with SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    source = smollm2()
    tok = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **SHAPE,
    )
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    if (Path(source) / "generation_config.json").is_file():
        shutil.copy2(Path(source) / "generation_config.json", dest / "generation_config.json")
    return dest


def _expert_names(tensors: dict[str, Any]) -> set[str]:
    return {k for k in tensors if ".mlp.experts." in k}


@pytest.mark.gpu
def test_a_qwen3_moe_trains_colocated_with_sglang_and_every_sync_matches_a_fresh_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("megatron.core")
    from safetensors.torch import load_file

    from rljob_runtime.checkpoint import store
    from rljob_runtime.colocation import Turns
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    model_dir = random_qwen3_moe(tmp_path / "qwen3-moe")
    on_disk = load_file(str(next(model_dir.glob("*.safetensors"))))
    experts = _expert_names(on_disk)
    # transformers writes one tensor per expert and projection: 4 layers x 16 experts x 3
    assert len(experts) == 4 * 16 * 3, sorted(on_disk)[:20]

    args = {**KIT_ARGS, "disable-cuda-graph": ""}  # the run's engine and the fresh servers: same kernels
    doc = sglang_job(tmp_path, backend="megatron", steps=2, sglang_args={"disable-cuda-graph": ""})
    doc["model"]["path"] = str(model_dir)
    doc["checkpoint"]["saveInterval"] = 2
    # A random model earns no reward, so every advantage is 0: the entropy bonus gives the router and
    # the experts a gradient, and a larger step than the demo's makes it show in bf16.
    doc["algorithm"]["entropyCoef"] = 0.01
    doc["training"]["optimizer"]["lr"] = 1e-3
    prepared = prepare(parse_spec(doc))
    checks: list[dict[str, Any]] = []
    real_to_engines = Turns.to_engines

    def to_engines(self: Turns, sync: Any) -> dict[str, float]:
        out = real_to_engines(self, sync)
        url = self.rollout.engine_urls()[0]
        version = http("GET", f"{url}/model_info")["weight_version"]
        engine_tokens = greedy(url)
        exported = export_dir(self.trainer, prepared.model_path, tmp_path / f"export-{version}")
        weights = load_file(str(exported / "model.safetensors"))
        moved = max(float((weights[k].float() - on_disk[k].float()).abs().max()) for k in experts)
        fresh = fresh_server_tokens(exported, tmp_path / f"fresh-{version}", args)
        checks.append(
            {
                "version": version,
                "equal": engine_tokens == fresh,
                "names_equal": set(weights) == set(on_disk),
                "experts_moved": moved,
                "router_moved": max(
                    float((weights[k].float() - on_disk[k].float()).abs().max())
                    for k in on_disk
                    if k.endswith("mlp.gate.weight")
                ),
            }
        )
        print("megatron-moe sync", json.dumps(checks[-1]), flush=True)
        return out

    def on_step(metrics: dict[str, float]) -> None:  # as it ends: a run cut short still tells
        row = {k: round(float(v), 5) for k, v in metrics.items() if k in KEYS or k.startswith("memory/")}
        print("megatron-moe step", metrics["step"], json.dumps(row), flush=True)

    monkeypatch.setattr(Turns, "to_engines", to_engines)
    result = run(prepared, RunOptions(on_step=on_step))
    results_file("megatron-moe", {"checks": checks, "history": result.history})

    assert result.steps_done == 2
    assert [c["version"] for c in checks] == ["1", "2"]
    assert all(c["names_equal"] for c in checks), checks
    assert all(c["equal"] for c in checks), (
        "the synced engine differs from a fresh server on the same weights"
    )
    assert all(c["experts_moved"] > 0 and c["router_moved"] > 0 for c in checks), checks
    assert abs(result.history[0]["train/ppo_kl"]) < 1e-3  # the first step is on-policy
    saved = store.iteration_dir(Path(doc["checkpoint"]["path"]), 2)
    hf = [p for p in saved.rglob("*.safetensors")]
    assert hf and any(_expert_names(load_file(str(p))) for p in hf), sorted(saved.rglob("*"))[:20]
