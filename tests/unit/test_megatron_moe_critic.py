"""advantageEstimator ppo with an MoE policy (test_megatron_moe_rank's tiny Qwen3-MoE) at expert
parallel size 2 on two CPU ranks (gloo): the critic, dense (algorithm.critic.path: a tiny Llama) at
expert parallel size 1 (``critic.critic_layout``) or MoE (by default the policy's model) at the
policy's 2, gives the values and the value loss of the same job at expert parallel size 1.

One two-rank run: for each critic, the job at EP 2 and at EP 1 each take two ppo steps (values first,
then the policy's and the critic's step) from the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from spawned_ranks import spawn_ranks
from test_megatron_critic import make_spec, ppo_step, rank_for
from test_megatron_moe import hf_model
from test_megatron_moe_rank import MOE, accept_expert_parallel
from test_megatron_reshard import cpu_training, write_model

from rljob_api.spec import RLTrainingJobSpec

CRITICS = ("dense", "moe")


def ppo_spec(model_dir: str, ep: int, critic: str | None) -> RLTrainingJobSpec:
    """test_megatron_critic's ppo spec on 2 GPUs with parallelism.expert ``ep`` and algorithm.critic.path
    ``critic`` (a copy, not re-validated: the API's models refuse expert > 1 yet)."""
    spec = make_spec(model_dir, gpus=2)
    par = spec.training.parallelism.model_copy(update={"expert": ep})
    training = spec.training.model_copy(update={"parallelism": par})
    algorithm = spec.algorithm.model_copy(
        update={"critic": spec.algorithm.critic.model_copy(update={"path": critic})}
    )
    return spec.model_copy(update={"training": training, "algorithm": algorithm})


def _two_ranks(rank: int, port: int, moe_dir: str, dense_dir: str, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_training()
    accept_expert_parallel()
    out: dict[str, Any] = {}
    for critic in CRITICS:
        for ep in (2, 1):
            r = rank_for(ppo_spec(moe_dir, ep, dense_dir if critic == "dense" else None), moe_dir, rank, 2)
            steps = [ppo_step(r) for _ in range(2)]  # the second step's values: the trained critic's
            out[f"{critic}{ep}"] = {
                "values": [before.values for before, _ in steps],
                "metrics": [metrics for _, metrics in steps],
                "critic_ep": r.critic.par.ep,
            }
    torch.save(out, Path(root) / f"result.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if torch.cuda.is_available():
        pytest.skip("CPU test (gloo, allgather dispatcher)")
    root = tmp_path_factory.mktemp("moe_critic")
    hf_model(root / "moe", **MOE)
    write_model(root / "dense")  # a tiny Llama of the same vocabulary
    spawn_ranks(_two_ranks, str(root / "moe"), str(root / "dense"), str(root))
    return [torch.load(root / f"result.{r}", weights_only=False) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("critic", CRITICS)
def test_the_critic_of_an_ep2_policy_gives_the_values_of_ep1(
    two_ranks: list[dict[str, Any]], critic: str
) -> None:
    for rank in two_ranks:
        ep2, ep1 = rank[f"{critic}2"], rank[f"{critic}1"]
        assert ep2["critic_ep"] == (1 if critic == "dense" else 2)
        first, second = ep2["values"]
        assert first.abs().sum() == 0 and second.abs().sum() > 0  # the head starts at zero, then learns
        assert torch.allclose(second, ep1["values"][1], rtol=1e-4, atol=1e-6)
        for step in range(2):
            got, want = ep2["metrics"][step], ep1["metrics"][step]
            assert got["critic_skipped_step"] == 0.0 and got["critic_grad_norm"] > 0
            for key in ("value_loss", "value_mean", "critic_grad_norm", "loss", "grad_norm"):
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), (step, key)
