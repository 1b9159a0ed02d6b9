"""Checkpoints of the megatron backend, in the layout ``checkpoint/store.py`` describes:

- ``<iter>/model/``: the policy as a Hugging Face directory (HF names, whole tensors gathered over TP
  and PP, in the training dtype) with the source model's config and tokenizer files, written by
  global rank 0: loadable by transformers and by the engines as it is.
- ``<iter>/trainer_rank<r>.pt``: each rank's optimizer shard (the inner torch optimizer's state and
  its fp32 main parameters, exactly), step, RNG states and the layout it was saved with.

Resuming needs the same layout (TP/PP/DP and world size), refused with the numbers otherwise; a
resharding resume (Megatron torch_dist) is not implemented.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..torch_backend import MODEL_DIR, STATE_FILE, _copy_side_files

WEIGHTS_FILE = "model.safetensors"


def write_hf_model(named: Mapping[str, torch.Tensor], source_dir: str | Path, dest: Path) -> None:
    """``named`` (HF names) as one safetensors file plus the source model's non-weight files."""
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / (WEIGHTS_FILE + ".tmp")
    save_file({k: v.contiguous() for k, v in named.items()}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, dest / WEIGHTS_FILE)
    _copy_side_files(Path(source_dir), dest)


def read_hf_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every safetensors tensor under ``directory`` (CPU)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def inner_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron optimizer (one, or one per ChainedOptimizer member):
    their parameters are this rank's fp32 main-parameter shards."""
    members = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [m.optimizer for m in members]


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def optimizer_state(optimizer: Any) -> list[dict[str, Any]]:
    """Per inner optimizer: its state_dict (moments, step, hyper-parameters) and main params (CPU)."""
    return [
        {
            "state_dict": opt.state_dict(),
            "main_params": [p.detach().to("cpu", copy=True) for p in _params(opt)],
        }
        for opt in inner_optimizers(optimizer)
    ]


@torch.no_grad()
def load_optimizer_state(optimizer: Any, saved: list[dict[str, Any]]) -> None:
    """Restore ``optimizer_state``: main params first (the model's bf16 weights come from the HF
    export, which rounds them), then the moments."""
    inner = inner_optimizers(optimizer)
    if len(inner) != len(saved):
        raise ValueError(f"checkpoint has {len(saved)} optimizer(s), this model {len(inner)}")
    for opt, state in zip(inner, saved, strict=True):
        params = _params(opt)
        shapes = [tuple(p.shape) for p in params]
        if shapes != [tuple(t.shape) for t in state["main_params"]]:
            raise ValueError("checkpoint optimizer shards do not match this rank's parameters")
        for param, value in zip(params, state["main_params"], strict=True):
            param.copy_(value.to(device=param.device, dtype=param.dtype))
        opt.load_state_dict(state["state_dict"])


def state_path(root: str | Path, rank: int) -> Path:
    return Path(root) / STATE_FILE.format(rank=rank)


def model_dir(root: str | Path) -> Path:
    return Path(root) / MODEL_DIR


def write_rank_state(root: str | Path, rank: int, state: dict[str, Any]) -> None:
    path = state_path(root, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def read_rank_state(root: str | Path, rank: int, layout: Mapping[str, int]) -> dict[str, Any]:
    """This rank's file, refused when it was saved with another layout."""
    state = torch.load(state_path(root, rank), map_location="cpu", weights_only=False)
    saved = state.get("layout", {})
    if dict(saved) != dict(layout):
        raise ValueError(f"checkpoint {root} was saved with layout {dict(saved)}, this run is {dict(layout)}")
    return state
