"""The ppo critic of the megatron backend (trainer/megatron/critic.py) on CPU, float32: a tiny untied
Llama as policy and critic, the value head starting at zero, the clipped value loss it trains with,
its checkpoint beside the policy's (model and Adam state round-trip, the next step identical), and the
same values and value loss over two tensor-parallel ranks (gloo) as on one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from spawned_ranks import spawn_ranks
from test_megatron_reshard import CONFIG, cpu_training, make_samples, write_model

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.trainer.base import build_batch, rank_rows
from rljob_runtime.trainer.megatron.critic import HF_HEAD, VALUE_HEAD, response_values

CRITIC_LR = 1e-2
ADV = torch.tensor([1.0, -0.5, 0.3, -1.0, 2.0, -1.0, 0.5, -0.2])


def make_spec(model_dir: str | Path, *, tp: int = 1, gpus: int = 1) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model_dir), "dtype": "float32"},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {
                "advantageEstimator": "ppo",
                "lossReduction": "token",
                "critic": {"lr": CRITIC_LR, "valueClip": 0.5},
            },
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4},
            "training": {
                "backend": "megatron",
                "globalBatchSize": 8,
                "microBatchSize": 2,
                "parallelism": {"tensor": tp},
                "optimizer": {"lr": 1e-3, "clipGrad": 1.0},
            },
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": gpus}},
        }
    )


def rank_for(spec: RLTrainingJobSpec, model_dir: str | Path, rank: int = 0, world: int = 1) -> Any:
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    r = MegatronTrainerRank(spec, str(model_dir), rank=rank, world_size=world, distributed_optimizer=False)
    r.device = torch.device("cpu")
    r._build()
    return r


def ppo_step(r: Any, returns_scale: float = 1.0) -> tuple[Any, dict[str, float]]:
    """Values (and log-probs) of this rank's rows, then one step whose critic learns returns of
    ``returns_scale`` on every response token."""
    from megatron.core import parallel_state as ps

    full = build_batch(make_samples())
    rows = rank_rows(full.size, 8, ps.get_data_parallel_world_size(), ps.get_data_parallel_rank())
    batch = full.select(rows)
    before = r.logprobs(batch)
    returns = returns_scale * batch.loss_mask.float()
    adv = (ADV[rows][:, None] * batch.loss_mask).float()
    metrics = r.train(batch, adv, before.logp, before.ref_logp, values=before.values, returns=returns)
    return before, metrics


def critic_state(r: Any) -> dict[str, torch.Tensor]:
    """The critic's parameters and Adam moments (this rank's shards), by parameter name."""
    from rljob_runtime.trainer.megatron.model import unwrap

    out = {}
    opt = r.critic.optimizer
    state = opt.optimizer.state
    for name, p in unwrap(r.critic.model).named_parameters():
        out[name] = p.detach().clone()
        for kind in ("exp_avg", "exp_avg_sq"):
            out[f"{kind}.{name}"] = state[p][kind].detach().clone()
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("critic") / "hf")


@pytest.fixture()
def cpu_rank(cpu_megatron: None) -> Any:
    from rljob_runtime.trainer.megatron.checkpoint_convert import undo_patches

    undo = cpu_training()
    yield
    undo_patches(undo)


def test_response_values_pick_the_position_before_each_response_token() -> None:
    batch = build_batch(make_samples()[:2])
    s = batch.input_ids.shape[1]
    values = torch.arange(2 * s, dtype=torch.float32).reshape(2, s)
    got = response_values(values, batch)
    mask = batch.response_mask() > 0
    want = values.gather(1, batch.logit_positions()) * mask
    assert torch.equal(got, want) and got.shape == batch.response_mask().shape


@pytest.mark.slow
def test_the_critic_starts_at_zero_and_learns_the_returns(model_dir: Path, cpu_rank: None) -> None:
    r = rank_for(make_spec(model_dir), model_dir)
    head = getattr(r.critic.model.module, VALUE_HEAD)
    assert head.weight.abs().sum() == 0 and head.bias.abs().sum() == 0  # no score.* in a causal LM
    before, m1 = ppo_step(r)
    assert before.values is not None and before.values.abs().max() == 0  # V = 0 everywhere at first
    # 0.5 * mean over tokens of (0 - 1)^2: the token-mean clipped value loss at V = 0, R = 1
    assert m1["value_loss"] == pytest.approx(0.5, rel=1e-6)
    assert m1["critic_lr"] == pytest.approx(CRITIC_LR) and m1["critic_skipped_step"] == 0.0
    assert m1["critic_grad_norm"] > 0 and m1["skipped_step"] == 0.0
    losses = [m1["value_loss"]] + [ppo_step(r)[1]["value_loss"] for _ in range(4)]
    assert losses[-1] < 0.5 * losses[0], losses  # it learns V -> R
    after, _ = ppo_step(r)
    mask = after.values != 0
    assert mask.any() and 0.3 < float(after.values[mask].mean()) <= 1.5


@pytest.mark.slow
def test_the_critic_round_trips_through_the_checkpoint(
    model_dir: Path, cpu_rank: None, tmp_path: Path
) -> None:
    a = rank_for(make_spec(model_dir), model_dir)
    ppo_step(a)
    a.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "critic" / "metadata.json").is_file()
    saved = critic_state(a)
    _, next_a = ppo_step(a, returns_scale=-1.0)

    b = rank_for(make_spec(model_dir), model_dir)
    b.load(str(tmp_path / "ckpt"))
    loaded = critic_state(b)
    assert sorted(loaded) == sorted(saved)
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())
    _, next_b = ppo_step(b, returns_scale=-1.0)
    for key in ("value_loss", "value_clipfrac", "critic_grad_norm", "loss"):
        assert next_b[key] == pytest.approx(next_a[key], rel=1e-6, abs=1e-9), key


@pytest.mark.slow
def test_a_checkpoint_without_a_critic_is_refused_by_name(
    model_dir: Path, cpu_rank: None, tmp_path: Path
) -> None:
    spec = make_spec(model_dir)
    grpo = spec.model_copy(
        update={"algorithm": spec.algorithm.model_copy(update={"advantage_estimator": "grpo"})}
    )
    rank_for(grpo, model_dir).save(str(tmp_path / "grpo"))
    with pytest.raises(FileNotFoundError, match=r"no critic in checkpoint .*advantageEstimator ppo"):
        rank_for(spec, model_dir).load(str(tmp_path / "grpo"))


def test_a_saved_value_head_is_loaded(cpu_megatron: None) -> None:
    from rljob_runtime.trainer.megatron import model_shape
    from rljob_runtime.trainer.megatron.critic import attach_value_head
    from rljob_runtime.trainer.megatron.model import build_gpt_model, init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    init_model_parallel(Parallelism(), 0)
    gpt = build_gpt_model(model_shape(CONFIG), Parallelism(), dtype=torch.float32)
    h = CONFIG["hidden_size"]
    head = {HF_HEAD[0]: torch.randn(1, h), HF_HEAD[1]: torch.tensor([0.25])}
    attach_value_head(gpt, head)
    loaded = getattr(gpt, VALUE_HEAD)
    assert torch.equal(loaded.weight, head[HF_HEAD[0]]) and torch.equal(loaded.bias, head[HF_HEAD[1]])
    with pytest.raises(ValueError, match=r"score.weight \(1, 3\) .* does not fit hidden size"):
        attach_value_head(
            build_gpt_model(model_shape(CONFIG), Parallelism(), dtype=torch.float32),
            {HF_HEAD[0]: torch.randn(1, 3), HF_HEAD[1]: torch.zeros(1)},
        )


# ------------------------------------------------------------------------------ two ranks (gloo)


def _tp_ranks(rank: int, port: int, model_dir: str, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_training()
    r = rank_for(make_spec(model_dir, tp=2, gpus=2), model_dir, rank, 2)
    out = {"steps": [ppo_step(r) for _ in range(2)]}
    torch.save(
        {"values": [b.values for b, _ in out["steps"]], "metrics": [m for _, m in out["steps"]]},
        Path(root) / f"tp.{rank}",
    )
    dist.destroy_process_group()


@pytest.mark.slow
def test_tensor_parallel_critic_equals_one_rank(model_dir: Path, cpu_rank: None, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU test")
    spawn_ranks(_tp_ranks, str(model_dir), str(tmp_path))
    tp = [torch.load(tmp_path / f"tp.{r}", weights_only=False) for r in range(2)]
    one = rank_for(make_spec(model_dir), model_dir)
    steps = [ppo_step(one) for _ in range(2)]
    for i, (values, metrics) in enumerate(steps):
        for r in range(2):  # both TP ranks hold the whole values and the same metrics
            assert torch.allclose(tp[r]["values"][i], values.values, atol=1e-5), (i, r)
            for key in ("value_loss", "value_mean", "critic_grad_norm"):
                assert tp[r]["metrics"][i][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), (
                    i,
                    r,
                    key,
                )


def test_each_head_parameter_takes_the_dtype_of_its_optimizer_group(cpu_megatron: None) -> None:
    """Megatron's distributed optimizer mis-maps a param group that mixes fp32 and bf16 parameters
    (seen on a GPU: the checkpoint save failed on the shapes). In a bf16 model the norms (the bias's
    no-weight-decay group) keep fp32 weights, fused or not; the linears (the weight's group) are bf16."""
    from rljob_runtime.trainer.megatron import model_shape
    from rljob_runtime.trainer.megatron.critic import attach_value_head
    from rljob_runtime.trainer.megatron.model import build_gpt_model, init_model_parallel
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    init_model_parallel(Parallelism(), 0)
    for fusions in ((), ("norm",)):
        gpt = build_gpt_model(model_shape(CONFIG), Parallelism(), dtype=torch.bfloat16, fusions=fusions)
        attach_value_head(gpt)
        head = getattr(gpt, VALUE_HEAD)
        no_decay = {
            p.dtype for name, p in gpt.named_parameters() if p.ndim == 1 and name != f"{VALUE_HEAD}.bias"
        }
        decay = {
            p.dtype for name, p in gpt.named_parameters() if p.ndim == 2 and name != f"{VALUE_HEAD}.weight"
        }
        assert no_decay == {torch.float32} and decay == {torch.bfloat16}, fusions
        assert (head.weight.dtype, head.bias.dtype) == (torch.bfloat16, torch.float32), fusions
