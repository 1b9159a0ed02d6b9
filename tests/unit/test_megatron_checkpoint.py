"""The megatron backend's checkpoint pieces that need no megatron-core (trainer/megatron/checkpoint.py):
the HF export is a directory transformers-style loaders read, a torch_dist checkpoint is found in a
run's iteration directory or given directly and anything else is refused saying what is there, and
RNG states survive megatron-core's ``torch.load(weights_only=True)`` and map to another layout by
``pick_rng``'s rule. (Saving and resuming at other layouts: test_megatron_reshard.py.)"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rljob_runtime.trainer.megatron import checkpoint as ckpt


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


def test_an_unreadable_weights_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken")
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors"):
        ckpt.read_hf_state(tmp_path)
    with pytest.raises(FileNotFoundError, match="no safetensors weights"):
        ckpt.read_hf_state(tmp_path / "missing")


def _marker(directory: Path, backend: str = "torch_dist") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metadata.json").write_text(
        json.dumps({"sharded_backend": backend, "sharded_backend_version": 1})
    )
    return directory


def test_a_dist_checkpoint_is_found_directly_or_in_a_run_iteration(tmp_path: Path) -> None:
    converted = _marker(tmp_path / "converted")
    assert ckpt.find_dist_checkpoint(converted) == converted
    iteration = tmp_path / "iter_0000003"
    _marker(iteration / "dist")
    assert ckpt.find_dist_checkpoint(iteration) == iteration / "dist"
    assert ckpt.is_dist_checkpoint(iteration / "dist") and not ckpt.is_dist_checkpoint(iteration)


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ("missing", "the directory does not exist"),
        ("empty", r"no metadata\.json there or in .*dist"),
        ("zarr", "does not name the torch_dist backend"),
        ("per-rank", r"per-rank trainer_rank<r>\.pt files of an earlier rljob version"),
    ],
)
def test_what_is_not_a_dist_checkpoint_is_refused_saying_what_is_there(
    tmp_path: Path, layout: str, match: str
) -> None:
    path = tmp_path / "ckpt"
    if layout != "missing":
        path.mkdir()
    if layout == "zarr":
        _marker(path, backend="zarr")
    if layout == "per-rank":
        (path / "trainer_rank0.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=match):
        ckpt.find_dist_checkpoint(path)


def test_rng_states_load_with_weights_only_and_restore_every_generator() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    tracker = {"model-parallel-rng": torch.ByteTensor([1, 2, 3])}
    state = ckpt.portable_rng_state(tracker)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # how megatron-core reads common.pt
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    assert torch.equal(ckpt.restore_rng_state(loaded)["model-parallel-rng"], tracker["model-parallel-rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected


def _saved(tp: int, pp: int, dp: int) -> list[dict]:
    """One RNG entry per rank of a layout in Megatron's order (TP fastest, then DP, then PP)."""
    out = []
    for rank in range(tp * pp * dp):
        coords = {"tp_rank": rank % tp, "dp_rank": rank // tp % dp, "pp_rank": rank // (tp * dp)}
        out.append({"rank": rank, **coords, "state": {"id": rank, "tracker": {"t": torch.tensor([rank])}}})
    return out


def test_the_same_layout_restores_each_rank_its_own_rng() -> None:
    layout = {"tp": 2, "pp": 2, "dp": 1, "world_size": 4}
    saved = _saved(2, 2, 1)
    for entry in saved:
        coords = {k: entry[k] for k in ("tp_rank", "pp_rank", "dp_rank")}
        state, tracker, how = ckpt.pick_rng(saved, layout, layout, coords)
        assert state["id"] == entry["rank"] and tracker and how.startswith("exact")


def test_another_layout_restores_what_maps() -> None:
    saved = _saved(2, 1, 1)
    tp2 = {"tp": 2, "pp": 1, "dp": 1}
    # TP unchanged (TP 2 x DP 2 from TP 2): generators of rank 0, the tracker of the same TP rank.
    state, tracker, _ = ckpt.pick_rng(
        saved, tp2, {"tp": 2, "pp": 1, "dp": 2}, {"tp_rank": 1, "pp_rank": 0, "dp_rank": 1}
    )
    assert state["id"] == 0 and tracker and int(state["tracker"]["t"]) == 1
    # TP changed: rank 0's generators, the tracker stays as the build seeded it.
    state, tracker, how = ckpt.pick_rng(
        saved, tp2, {"tp": 1, "pp": 1, "dp": 2}, {"tp_rank": 0, "pp_rank": 0, "dp_rank": 1}
    )
    assert state["id"] == 0 and not tracker and "TP size changed" in how


def test_another_expert_parallel_size_is_another_layout() -> None:
    """EP splits the data-parallel ranks without changing their coordinates: only the recorded "ep"
    tells the layouts apart. A checkpoint saved before "ep" was recorded ran at EP 1."""
    saved = _saved(1, 1, 2)
    coords = {"tp_rank": 0, "pp_rank": 0, "dp_rank": 1}
    ep2 = {"tp": 1, "pp": 1, "dp": 2, "ep": 2}
    state, tracker, how = ckpt.pick_rng(saved, {**ep2, "ep": 1}, ep2, coords)
    assert state["id"] == 0 and tracker and how.startswith("generators of saved rank 0")
    assert ckpt.pick_rng(saved, ep2, ep2, coords)[2].startswith("exact")
    before_ep = {"tp": 1, "pp": 1, "dp": 2}
    assert ckpt.pick_rng(saved, before_ep, {**ep2, "ep": 1}, coords)[2].startswith("exact")
    assert not ckpt.pick_rng(saved, before_ep, ep2, coords)[2].startswith("exact")
