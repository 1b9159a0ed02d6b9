"""Qwen3-MoE through the megatron backend's real rank on CPU (gloo): a tiny random transformers
Qwen3MoeForCausalLM checkpoint (layers 0 and 2 MoE with 4 experts, top 2; layer 1 dense) built by
``model.build_gpt_model`` (megatron-core's decoder block spec, SequentialMLP experts, the allgather
token dispatcher), trained with the GRPO loss, exported to HF names and checkpointed, at expert
parallel size 1 and 2 on two ranks (data parallel 2 either way; aux loss off, as HF's config has it).

One two-rank run (``_two_ranks``): EP 2 trains a step, exports, saves checkpoint A, then trains a
second step (the uninterrupted run); EP 2 and EP 1 each load A and train that second step; EP 1 trains
the first step from the HF weights. The two layouts must agree on loss and grad norm and on the
exported weights (every expert once, under its HF name), and each resume on the restored weights and
the second step. The driver's ``TrainerGroup``, placed by the ranks' real layouts, exports through
both EP ranks at EP 2 and through data-parallel rank 0 alone at EP 1 (``group_export``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from spawned_ranks import spawn_ranks
from test_megatron_moe import hf_model
from test_megatron_reshard import ADV, LR, cpu_training, make_spec, step, trainer

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.parallel import validate_parallelism
from rljob_runtime.trainer.megatron.testing import SMOLLM2_135M

MOE: dict[str, Any] = dict(
    vocab_size=300,  # test_megatron_reshard's samples draw token ids below 300; padded to 384
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    mlp_only_layers=[1],
)


def accept_expert_parallel() -> None:
    """The runtime's support matrix without its refusal of parallelism.expert above 1 (admission keeps
    it until MoE runs on GPUs), in this process."""
    from rljob_api import support

    support.LIMITS = tuple(lim for lim in support.LIMITS if lim.field != ".training.parallelism.expert")


def moe_spec(model_dir: str | Path, ep: int) -> RLTrainingJobSpec:
    """test_megatron_reshard's spec (2 GPUs, float32, GRPO) with parallelism.expert ``ep`` (a copy,
    not re-validated: the API's models refuse expert > 1 yet)."""
    spec = make_spec(model_dir)
    par = spec.training.parallelism.model_copy(update={"expert": ep})
    return spec.model_copy(update={"training": spec.training.model_copy(update={"parallelism": par})})


# ------------------------------------------------------------------------------ two ranks (gloo)


def hf_grads(rank_: Any) -> dict[str, torch.Tensor]:
    """The last step's gradients (data-parallel averaged, clipped) under HF names, each expert's
    gathered from the EP rank holding it: what megatron-core's optimizer stepped with (tp = pp = 1)."""
    from rljob_runtime.trainer.megatron.convert import megatron_to_hf
    from rljob_runtime.trainer.megatron.expert_parallel import gather_experts, is_expert
    from rljob_runtime.trainer.megatron.model import unwrap

    grads = {n: p.grad.detach().clone() for n, p in unwrap(rank_.model).named_parameters()}
    experts = gather_experts({n: g for n, g in grads.items() if is_expert(n)}, rank_.shape.moe, rank_.par.ep)
    dense = {n: g for n, g in grads.items() if not is_expert(n)}
    return megatron_to_hf({**dense, **experts}, rank_.shape)


class _Actor:
    """A rank as ``TrainerGroup`` calls its Ray actor (``actor.method.remote(...)``): this process's
    rank runs the call at once; the other process's rank is a stand-in (that process makes the call
    on its own rank through its own group)."""

    def __init__(self, rank_: Any | None) -> None:
        self.rank_ = rank_

    def __getattr__(self, name: str) -> Any:
        target = self.rank_

        class _Method:
            def remote(self, *args: Any, **kwargs: Any) -> Any:
                return None if target is None else getattr(target, name)(*args, **kwargs)

        return _Method()


def group_export(rank_: Any, rank: int) -> dict[str, Any]:
    """The weights as the driver's ``TrainerGroup`` exports them, its ranks placed by their real
    layouts: which ranks it asks, and (global rank 0) what it got. A group that leaves out an EP
    peer would leave rank 0 waiting in the expert gather: the export runs only when both processes'
    groups ask both ranks, and the test then fails on the ranks asked instead of hanging."""
    from rljob_runtime.trainer import group as group_mod

    layouts: list[Any] = [None, None]
    dist.all_gather_object(layouts, rank_.layout())
    actors = [_Actor(rank_ if r == rank else None) for r in range(2)]
    group = group_mod.TrainerGroup(rank_.spec, actors)
    group.use_layouts(layouts)
    asked = [actors.index(a) for a in group._exporters()]
    every: list[Any] = [None, None]
    dist.all_gather_object(every, asked)
    group_mod._gather = lambda refs, timeout_s=None: list(refs)  # no Ray: the calls above ran already
    wanted = [0, 1] if rank_.par.ep > 1 else [0]
    export = group.named_tensors() if every == [wanted, wanted] else None
    return {"asked": asked, "export": export}


def _two_ranks(rank: int, port: int, model_dir: str, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_training()
    accept_expert_parallel()
    base, out = Path(root), {}
    a = trainer(moe_spec(model_dir, 2), model_dir, rank, 2)
    out["layout"] = a.layout()
    out["ep2"] = {"m1": step(a, ADV), "grads": hf_grads(a), "export": a.named_tensors()}
    out["group2"] = group_export(a, rank)
    a.save(str(base / "A"))
    out["ep2"] |= {"m2": step(a, -ADV), "after2": a.named_tensors()}
    for ep in (2, 1):
        r = trainer(moe_spec(model_dir, ep), model_dir, rank, 2)
        r.load(str(base / "A"))
        out[f"resume{ep}"] = {"loaded": r.named_tensors(), "m2": step(r, -ADV), "after2": r.named_tensors()}
    r = trainer(moe_spec(model_dir, 1), model_dir, rank, 2)
    out["ep1"] = {"m1": step(r, ADV), "grads": hf_grads(r), "export": r.named_tensors()}
    out["group1"] = group_export(r, rank)
    torch.save(out, base / f"result.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if torch.cuda.is_available():
        pytest.skip("CPU test (gloo, allgather dispatcher)")
    root = tmp_path_factory.mktemp("moe")
    _, hf, _ = hf_model(root / "hf", **MOE)
    spawn_ranks(_two_ranks, str(root / "hf"), str(root))
    ranks = [torch.load(root / f"result.{r}", weights_only=False) for r in range(2)]
    return {"root": root, "hf": hf, "ranks": ranks, **ranks[0]}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.allclose(got[name], tensor, rtol=0, atol=atol), (
            name,
            float((got[name] - tensor).abs().max()),
        )


@pytest.mark.slow
def test_ep2_trains_the_step_of_ep1(two_ranks: dict[str, Any]) -> None:
    ep1, ep2 = two_ranks["ep1"], two_ranks["ep2"]
    assert {k: two_ranks["layout"][k] for k in ("dp", "ep")} == {"dp": 2, "ep": 2}
    assert [two_ranks["ranks"][r]["layout"]["ep_rank"] for r in (0, 1)] == [0, 1]
    assert ep2["m1"]["skipped_step"] == 0.0 and ep2["m1"]["grad_norm"] > 0
    for key in ("loss", "pg_loss", "grad_norm"):
        assert ep2["m1"][key] == pytest.approx(ep1["m1"][key], rel=1e-5, abs=1e-7), key
    # The HF export after the step: every tensor of the checkpoint (each expert once), as EP 1 has it.
    hf = two_ranks["hf"]
    assert sorted(ep2["export"]) == sorted(hf) == sorted(ep1["export"])
    assert any(".mlp.experts.3.down_proj" in k for k in hf) and "model.layers.1.mlp.up_proj.weight" in hf
    # Every gradient, experts' included, as EP 1's (which rank's tokens reach an expert changes only
    # the order of float32 sums).
    assert sorted(ep2["grads"]) == sorted(hf)
    for name, grad in ep1["grads"].items():
        assert torch.allclose(ep2["grads"][name], grad, rtol=1e-4, atol=1e-8), name
    assert all(ep2["grads"][k].abs().sum() > 0 for k in hf if ".experts." in k)  # every expert trained
    moved = max(float((ep2["export"][k] - t).abs().max()) for k, t in hf.items())
    assert moved > LR / 2  # Adam moved the weights by about lr ...
    # ... and both layouts alike: Adam's first step is lr * g / (|g| + eps), so a gradient within
    # float32 noise of 0 moves its weight by a part of lr that the noise decides (seen: 2e-6).
    assert_same(ep2["export"], ep1["export"], atol=LR / 50)
    assert two_ranks["ranks"][1]["ep2"]["export"] == {}  # only global rank 0 sends


@pytest.mark.slow
def test_the_trainer_group_exports_through_every_ep_peer(two_ranks: dict[str, Any]) -> None:
    """``TrainerGroup`` asks every rank that holds part of the experts (both data-parallel ranks at
    EP 2; only data-parallel rank 0 at EP 1) and gets the whole model from global rank 0."""
    ranks = two_ranks["ranks"]
    assert [ranks[r]["group2"]["asked"] for r in (0, 1)] == [[0, 1], [0, 1]]
    assert [ranks[r]["group1"]["asked"] for r in (0, 1)] == [[0], [0]]
    assert [ranks[r]["layout"]["exports_weights"] for r in (0, 1)] == [1, 1]
    assert_same(ranks[0]["group2"]["export"], two_ranks["ep2"]["export"])
    assert_same(ranks[0]["group1"]["export"], two_ranks["ep1"]["export"])
    assert ranks[1]["group2"]["export"] is None  # the stand-in for rank 0 in rank 1's group


@pytest.mark.slow
@pytest.mark.parametrize("ep", [2, 1])
def test_an_ep2_checkpoint_resumes_at_ep(two_ranks: dict[str, Any], ep: int) -> None:
    run, resumed = two_ranks["ep2"], two_ranks[f"resume{ep}"]
    assert_same(resumed["loaded"], run["export"])  # weights restored exactly
    for key in ("loss", "pg_loss", "grad_norm"):
        assert resumed["m2"][key] == pytest.approx(run["m2"][key], rel=1e-5, abs=1e-7), key
    assert_same(resumed["after2"], run["after2"], atol=2e-6)  # the Adam moments came back too


@pytest.mark.slow
def test_the_checkpoint_keeps_the_whole_hf_export(two_ranks: dict[str, Any]) -> None:
    from rljob_runtime.trainer.megatron.checkpoint import read_hf_state

    assert_same(read_hf_state(two_ranks["root"] / "A" / "model"), two_ranks["ep2"]["export"])


# ------------------------------------------------------------------------ one rank, this process


def test_the_builder_gives_transformers_logits(tmp_path: Path, cpu_megatron: None) -> None:
    """EP 1 through ``build_gpt_model`` (SDPA attention, the layers from the decoder block spec) and
    ``load_hf_weights``: the logits of transformers' Qwen3MoeForCausalLM."""
    from rljob_runtime.trainer.megatron.model import (
        build_gpt_model,
        forward_logits,
        init_model_parallel,
        load_hf_weights,
    )
    from rljob_runtime.trainer.megatron.parallel import Parallelism

    config, hf, reference = hf_model(tmp_path, **MOE)
    shape = model_shape(config)
    assert shape.moe is not None and shape.moe.moe_layers == (0, 2) and shape.qk_norm
    init_model_parallel(Parallelism(), 0)
    model = build_gpt_model(shape, Parallelism(), dtype=torch.float32)
    load_hf_weights(model, hf, shape, Parallelism())
    ids = torch.randint(0, MOE["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = forward_logits(model, ids, shape), reference(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), float((ours - theirs).abs().max())


# ------------------------------------------------------------------------------------ refusals


def _moe_config(**over: Any) -> dict[str, Any]:
    return {
        **MOE,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "rope_theta": 1e6,
        **over,
    }


@pytest.mark.parametrize(
    ("config", "sizes", "message"),
    [
        (
            _moe_config(),
            {"dp": 3, "ep": 3},
            r"4 experts are not divisible by training\.parallelism\.expert 3",
        ),
        (_moe_config(), {"ep": 2}, r"training\.parallelism\.expert 2 does not divide .* data 1 = 1"),
        (
            SMOLLM2_135M,
            {"dp": 2, "ep": 2},
            r"training\.parallelism\.expert 2 needs an MoE model \(LlamaForCausalLM has no experts\): set it to 1",
        ),
        (_moe_config(), {"tp": 2}, "tensor parallel size 2 with 4 experts needs sequence parallelism"),
    ],
)
def test_layouts_experts_cannot_take_are_refused(
    config: dict[str, Any], sizes: dict[str, int], message: str
) -> None:
    tp = sizes.get("tp", 1)
    dp = sizes.get("dp", 1)
    with pytest.raises(ValueError, match=message):
        validate_parallelism(config, tp=tp, dp=dp, ep=sizes.get("ep", 1), gpus=tp * dp)


def test_the_spec_s_expert_size_reaches_the_layout(tmp_path: Path) -> None:
    from rljob_runtime.trainer.megatron.checks import check_layout

    _, par = check_layout(moe_spec(tmp_path, 2), _moe_config())
    assert (par.dp, par.ep) == (2, 2)
    dynamic = moe_spec(tmp_path, 2)
    training = dynamic.training.model_copy(
        update={"dynamic_batch": dynamic.training.dynamic_batch.model_copy(update={"enabled": True})}
    )
    with pytest.raises(ValueError, match=r"training\.dynamicBatch with training\.parallelism\.expert 2"):
        check_layout(dynamic.model_copy(update={"training": training}), _moe_config())
    assert model_shape(SMOLLM2_135M).moe is None
