"""The megatron backend through the runtime's wiring: ``create_trainer`` starts MegatronTrainerRanks
as Ray actors on their GPUs (TP 2 on two GPUs, else TP 1), and the group's logprobs / train /
named_tensors / save / load behave as the torch backend's.

Checkpoints: save -> a fresh group -> load gives back the same weights (bit-exact), the same
optimizer shards (a re-save is tensor-equal), the same log-probs, and one more step from there
matches the uninterrupted run's next step; the saved model/ directory loads in transformers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent))
from megatron_backend_case import ADV, CONFIG, make_samples, write_model

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.trainer.base import build_batch
from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.testing import random_hf_state, stored_tensors


def _spec(model_dir: Path, gpus: int) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model_dir), "dtype": "bfloat16"},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {"useKLLoss": True, "klLossCoef": 0.01, "lossReduction": "token"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4, "temperature": 0.8},
            "training": {
                "backend": "megatron",
                "numRollout": 4,
                "globalBatchSize": 4,  # two optimizer steps per train call
                "microBatchSize": 2,
                "parallelism": {"tensor": gpus},
                "optimizer": {"lr": 1e-4, "clipGrad": 1.0},
            },
            "resources": {"device": "cuda", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": gpus}},
        }
    )


def _step(trainer: Any, samples: list[Any], adv: torch.Tensor) -> tuple[Any, dict[str, float]]:
    lp = trainer.logprobs(samples)
    mask = build_batch(samples).loss_mask
    return lp, trainer.train(samples, adv[:, None] * mask, lp.logp, lp.ref_logp)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import ray

    from rljob_runtime.placement import create_placement, local_resources
    from rljob_runtime.trainer import create_trainer

    gpus = min(torch.cuda.device_count(), 2)
    root = tmp_path_factory.mktemp("megatron-group")
    model = write_model(root / "model")
    spec = _spec(model, gpus)
    samples = make_samples()
    ray.init(num_cpus=gpus + 4, num_gpus=gpus, resources=local_resources(spec), include_dashboard=False)
    out: dict[str, Any] = {"gpus": gpus, "ckpt": root / "ckpt", "resaved": root / "resaved"}
    try:
        placement = create_placement(spec)
        first = create_trainer(spec, str(model), placement.trainer)
        out["dp_ranks"] = first.dp_ranks
        out["initial"] = first.named_tensors()
        out["lp1"], out["m1"] = _step(first, samples, ADV)
        first.save(str(out["ckpt"]))
        out["saved"] = first.named_tensors()
        out["lp2"], out["m2"] = _step(first, samples, -ADV)
        out["after2"] = first.named_tensors()
        first.shutdown()

        second = create_trainer(spec, str(model), placement.trainer)
        second.load(str(out["ckpt"]))
        out["loaded"] = second.named_tensors()
        second.save(str(out["resaved"]))
        out["lp2_resumed"], out["m2_resumed"] = _step(second, samples, -ADV)
        out["after2_resumed"] = second.named_tensors()
        second.shutdown()
    finally:
        ray.shutdown()
    for key in ("m1", "m2", "m2_resumed"):
        print(key, {k: round(v, 6) for k, v in out[key].items()})
    return out


def test_ranks_run_as_ray_actors_and_learn(run: dict[str, Any]) -> None:
    assert run["dp_ranks"] == [0] * run["gpus"]  # TP peers: one replica, the same rows
    assert sorted(run["initial"]) == sorted(random_hf_state(model_shape(CONFIG), seed=11))
    assert run["m1"]["skipped_step"] == 0.0  # (two optimizer steps: the second is off-policy)
    mask = build_batch(make_samples()).loss_mask
    delta = ((run["lp2"].logp - run["lp1"].logp) * mask).sum(-1) / mask.sum(-1)
    assert torch.all(torch.sign(delta) == torch.sign(ADV)), delta  # moved with the advantages
    assert any(not torch.equal(run["initial"][k], run["saved"][k]) for k in run["initial"])


def test_load_restores_weights_and_optimizer_exactly(run: dict[str, Any]) -> None:
    for name, tensor in run["saved"].items():
        assert torch.equal(run["loaded"][name], tensor), name
    # The distributed checkpoint saved, loaded and saved again holds the same tensors, optimizer too.
    a, b = stored_tensors(run["ckpt"] / "dist"), stored_tensors(run["resaved"] / "dist")
    assert sorted(a) == sorted(b)
    optimizer = [k for k in a if k.startswith("optimizer.")]
    assert optimizer, sorted(a)[:5]
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert torch.equal(run["lp2"].logp, run["lp2_resumed"].logp)


def test_one_more_step_matches_the_uninterrupted_run(run: dict[str, Any]) -> None:
    m2, resumed = run["m2"], run["m2_resumed"]
    for key in ("loss", "pg_loss", "ppo_kl", "grad_norm", "lr"):
        # The first of the two optimizer steps starts from bit-exact state; the second may differ by
        # the rounding of non-deterministic GPU reductions (atomics in the embedding backward).
        assert resumed[key] == pytest.approx(m2[key], rel=1e-4, abs=1e-7), key
    worst, exact = 0.0, 0
    for name, tensor in run["after2"].items():
        other = run["after2_resumed"][name]
        exact += int(torch.equal(tensor, other))
        worst = max(worst, float((tensor.float() - other.float()).abs().max()))
    print(f"after the resumed step: {exact}/{len(run['after2'])} tensors bit-exact, max abs diff {worst:.3g}")
    assert worst <= 1e-2 * max(float(t.float().abs().max()) for t in run["after2"].values())


def test_the_checkpoint_model_dir_loads_in_transformers(run: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM

    # float32: the export keeps each tensor's training dtype (bf16 matrices, fp32 norms), all exact in fp32.
    model = AutoModelForCausalLM.from_pretrained(str(run["ckpt"] / "model"), dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in run["saved"].items():
        assert torch.equal(state[name], tensor.float()), name
