"""The megatron backend's checkpoint pieces on CPU (trainer/megatron/checkpoint.py): optimizer shards
round-trip exactly through a file, a checkpoint of another layout is refused with both layouts, and
the HF export is a directory transformers-style loaders read (weights + the source's side files)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rljob_runtime.trainer.megatron import checkpoint as ckpt


def _optimizer(seed: int) -> SimpleNamespace:
    """A stand-in for a Megatron optimizer: ``.optimizer`` is the torch optimizer of the main params."""
    gen = torch.Generator().manual_seed(seed)
    params = [
        torch.nn.Parameter(torch.randn(4, 3, generator=gen)),
        torch.nn.Parameter(torch.randn(5, generator=gen)),
    ]
    return SimpleNamespace(optimizer=torch.optim.AdamW(params, lr=1e-2))


def _steps(opt: SimpleNamespace, n: int) -> None:
    for _ in range(n):
        for p in opt.optimizer.param_groups[0]["params"]:
            p.grad = torch.sin(p.detach() * 3.0)
        opt.optimizer.step()


def test_optimizer_shards_round_trip_exactly(tmp_path: Path) -> None:
    a = _optimizer(0)
    _steps(a, 3)
    layout = {"world_size": 1, "tp": 1, "pp": 1, "dp": 1}
    ckpt.write_rank_state(tmp_path, 0, {"layout": layout, "optimizer": ckpt.optimizer_state(a)})
    b = _optimizer(1)  # other weights, no moments yet
    ckpt.load_optimizer_state(b, ckpt.read_rank_state(tmp_path, 0, layout)["optimizer"])
    for pa, pb in zip(
        a.optimizer.param_groups[0]["params"], b.optimizer.param_groups[0]["params"], strict=True
    ):
        assert torch.equal(pa, pb)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a.optimizer.state[pa][key], b.optimizer.state[pb][key]), key
    _steps(a, 1)
    _steps(b, 1)  # and they go on identically
    assert all(
        torch.equal(pa, pb)
        for pa, pb in zip(
            a.optimizer.param_groups[0]["params"], b.optimizer.param_groups[0]["params"], strict=True
        )
    )


def test_chained_optimizers_are_all_saved() -> None:
    chained = SimpleNamespace(chained_optimizers=[_optimizer(0), _optimizer(1)])
    assert len(ckpt.inner_optimizers(chained)) == 2
    with pytest.raises(ValueError, match="checkpoint has 2 optimizer"):
        ckpt.load_optimizer_state(_optimizer(0), ckpt.optimizer_state(chained))


def test_shards_of_another_shape_are_refused() -> None:
    saved = ckpt.optimizer_state(_optimizer(0))
    other = SimpleNamespace(optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.zeros(7))]))
    with pytest.raises(ValueError, match="do not match"):
        ckpt.load_optimizer_state(other, saved)


def test_a_checkpoint_of_another_layout_is_refused(tmp_path: Path) -> None:
    ckpt.write_rank_state(tmp_path, 0, {"layout": {"world_size": 2, "tp": 2, "pp": 1, "dp": 1}})
    with pytest.raises(ValueError, match=r"saved with layout .*'tp': 2.*this run is .*'tp': 1"):
        ckpt.read_rank_state(tmp_path, 0, {"world_size": 2, "tp": 1, "pp": 1, "dp": 2})


def test_hf_export_writes_weights_and_side_files(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (source / "tokenizer.json").write_text("{}")
    (source / "model-00001-of-00002.safetensors").write_text("not copied")
    (source / "model.safetensors.index.json").write_text("{}")
    named = {"model.embed_tokens.weight": torch.arange(6, dtype=torch.bfloat16).view(2, 3)}
    ckpt.write_hf_model(named, source, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    back = ckpt.read_hf_state(tmp_path / "out")
    assert torch.equal(back["model.embed_tokens.weight"], named["model.embed_tokens.weight"])
