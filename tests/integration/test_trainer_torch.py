"""The torch trainer backend as Ray actors: 2 data-parallel ranks (gloo) on a local Ray, random
2-layer model. One module-scoped run does everything once (three trainer groups: a run that saves a
checkpoint and goes on, a fresh group that resumes from it, and a ppo step with a critic); the tests
check its record.

Every Ray process is stopped in the fixture's teardown, also when a test fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import ray
import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime import placement
from rljob_runtime.algo.advantages import compute_advantages
from rljob_runtime.data.sample import Sample
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.trainer.base import LogProbs, build_batch
from rljob_runtime.trainer.group import TrainerGroup

ADV = [1.0, -1.0, -1.0, 1.0]


def make_spec(model: Path) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/unused.jsonl"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2, "temperature": 0.8},
            "training": {
                "backend": "torch",
                "globalBatchSize": 4,
                "microBatchSize": 1,
                "optimizer": {
                    "lr": 1e-4,
                    "lrWarmupSteps": 2,
                    "lrDecayStyle": "cosine",
                    "minLr": 1e-5,
                    "weightDecay": 0.01,
                },
                "numRollout": 4,
            },
            "resources": {"device": "cpu", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": 2}},
        }
    )


def make_samples(seed: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    return [
        Sample(
            group_index=i // 2,
            index=i,
            prompt_ids=torch.randint(100, 5000, (3 + i % 2,), generator=gen).tolist(),
            response_ids=torch.randint(100, 5000, (2 + 2 * i,), generator=gen).tolist(),
            rollout_logprobs=None,
        )
        for i in range(4)
    ]


def advantages(samples: list[Sample]) -> torch.Tensor:
    return torch.tensor(ADV)[:, None] * build_batch(samples).loss_mask


def rank_weights(group: TrainerGroup) -> list[dict[str, torch.Tensor]]:
    return ray.get([actor.named_tensors.remote() for actor in group.actors])


def rank_pids(group: TrainerGroup) -> list[int]:
    return ray.get([actor.__ray_call__.remote(lambda _self: os.getpid()) for actor in group.actors])


@dataclass
class Record:
    model: Path
    initial: LogProbs | None = None
    step1: dict[str, float] = field(default_factory=dict)
    after_step1: LogProbs | None = None
    weights1: list[dict[str, torch.Tensor]] = field(default_factory=list)
    named1: dict[str, torch.Tensor] = field(default_factory=dict)
    step2: dict[str, float] = field(default_factory=dict)
    weights2: dict[str, torch.Tensor] = field(default_factory=dict)
    resumed_logprobs: LogProbs | None = None
    resumed_step2: dict[str, float] = field(default_factory=dict)
    resumed_weights2: list[dict[str, torch.Tensor]] = field(default_factory=list)
    checkpoint: Path | None = None
    ppo_step: dict[str, float] = field(default_factory=dict)
    ppo_values: LogProbs | None = None
    critic_weights: list[dict[str, torch.Tensor]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    wall: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Record]:
    tmp = tmp_path_factory.mktemp("trainer")
    model = make_tiny_model(tmp / "model", seed=5)
    spec = make_spec(model)
    record = Record(model=model, checkpoint=tmp / "ckpt")
    ray.init(
        num_cpus=2,
        resources=placement.local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    groups: list[TrainerGroup] = []
    try:
        slots = placement.create_placement(spec, timeout_s=60).trainer
        start = time.monotonic()
        group = TrainerGroup.create(spec, str(model), slots, dist_timeout_s=120)
        groups.append(group)
        record.wall["create"] = time.monotonic() - start
        record.pids += rank_pids(group)
        rollout1, rollout2 = make_samples(1), make_samples(2)

        record.initial = group.logprobs(rollout1)
        record.step1 = group.train(rollout1, advantages(rollout1), record.initial.logp)
        record.after_step1 = group.logprobs(rollout1)
        record.weights1 = rank_weights(group)
        record.named1 = group.named_tensors()
        group.save(str(record.checkpoint))
        old2 = group.logprobs(rollout2)
        record.step2 = group.train(rollout2, advantages(rollout2), old2.logp)
        record.weights2 = group.named_tensors()
        group.shutdown()

        start = time.monotonic()
        resumed = TrainerGroup.create(spec, str(model), slots, dist_timeout_s=120)
        groups.append(resumed)
        record.pids += rank_pids(resumed)
        resumed.load(str(record.checkpoint))
        record.wall["resume"] = time.monotonic() - start
        record.resumed_logprobs = resumed.logprobs(rollout2)
        assert torch.equal(record.resumed_logprobs.logp, old2.logp)
        record.resumed_step2 = resumed.train(rollout2, advantages(rollout2), record.resumed_logprobs.logp)
        record.resumed_weights2 = rank_weights(resumed)
        resumed.shutdown()

        ppo_spec = make_spec(model)
        ppo_spec.algorithm.advantage_estimator = "ppo"
        ppo = TrainerGroup.create(ppo_spec, str(model), slots, dist_timeout_s=120)
        groups.append(ppo)
        record.pids += rank_pids(ppo)
        record.ppo_values = ppo.logprobs(rollout1)
        mask = build_batch(rollout1).loss_mask
        adv = compute_advantages(
            ppo_spec.algorithm, torch.tensor(ADV), mask, 2, values=record.ppo_values.values
        )
        record.ppo_step = ppo.train(
            rollout1,
            adv.advantages,
            record.ppo_values.logp,
            values=record.ppo_values.values,
            returns=adv.returns,
        )
        record.critic_weights = ray.get(
            [a.__ray_call__.remote(lambda rank: rank.critic.state_dict()) for a in ppo.actors]
        )
        ppo.shutdown()
        yield record
    finally:
        for group in groups:
            group.shutdown()
        ray.shutdown()


def test_first_step_is_on_policy_and_follows_the_advantage(run: Record) -> None:
    assert run.step1["ppo_kl"] == 0.0
    assert run.step1["pg_clipfrac"] == 0.0
    assert run.step1["lr"] == pytest.approx(5e-5)  # warm-up step 1 of 2
    assert run.step1["grad_norm"] > 0
    assert run.initial is not None and run.after_step1 is not None
    mask = (run.initial.logp != 0).float()
    delta = ((run.after_step1.logp - run.initial.logp) * mask).sum(-1) / mask.sum(-1)
    assert torch.all(torch.sign(delta) == torch.tensor(ADV)), delta


def test_ranks_hold_identical_weights_after_a_step(run: Record) -> None:
    rank0, rank1 = run.weights1
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name


def test_named_tensors_are_rank0_weights_under_hf_names(run: Record) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(run.model), dtype=torch.float32).state_dict()
    assert run.named1.keys() == hf.keys()
    changed = 0
    for name, tensor in run.named1.items():
        assert tensor.device.type == "cpu" and not tensor.requires_grad
        assert torch.equal(tensor, run.weights1[0][name]), name
        changed += not torch.equal(tensor, hf[name])
    assert changed == len(hf)  # every weight moved: the step reached all parameters
    assert torch.equal(run.named1["lm_head.weight"], run.named1["model.embed_tokens.weight"])  # tied


def test_resume_continues_bit_for_bit(run: Record) -> None:
    assert run.checkpoint is not None
    assert (run.checkpoint / "model" / "model.safetensors").is_file()
    assert (run.checkpoint / "model" / "tokenizer_config.json").is_file()
    assert {p.name for p in run.checkpoint.glob("trainer_rank*.pt")} == {
        "trainer_rank0.pt",
        "trainer_rank1.pt",
    }
    assert run.resumed_step2 == run.step2
    assert run.step2["ppo_kl"] == 0.0
    assert run.step2["lr"] == pytest.approx(1e-4)  # the schedule position was restored
    for weights in run.resumed_weights2:
        assert weights.keys() == run.weights2.keys()
        for name in weights:
            assert torch.equal(weights[name], run.weights2[name]), name


def test_ppo_critic_is_data_parallel(run: Record) -> None:
    """The critic's values come back in the samples' order and both ranks' critics stay identical."""
    assert run.ppo_values is not None and run.ppo_values.values is not None
    assert run.ppo_values.values.shape == run.ppo_values.logp.shape
    assert run.ppo_step["value_clipfrac"] == 0.0 and run.ppo_step["value_loss"] > 0
    rank0, rank1 = run.critic_weights
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert torch.any(rank0["score.weight"] != 0)  # the zero-initialised head took a step


def test_no_orphan_processes(run: Record) -> None:
    """Every group's rank processes are gone once shut down."""
    assert len(run.pids) == 6
    deadline = time.monotonic() + 15
    alive = run.pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.2)
    assert not alive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
