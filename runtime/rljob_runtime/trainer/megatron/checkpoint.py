"""Checkpoints of the megatron backend, in the layout ``checkpoint/store.py`` describes:

- ``<iter>/model/``: the policy as a Hugging Face directory (HF names, whole tensors gathered over TP
  and PP, in the training dtype) with the source model's config and tokenizer files, written by
  global rank 0: loadable by transformers and by the engines (of a resumed run too) as it is.
- ``<iter>/dist/``: the trainer's state as a Megatron distributed checkpoint (megatron-core
  ``dist_checkpointing``, torch_dist backend, see ``dist_checkpoint.py``): the model, the optimizer
  (Adam moments and fp32 main parameters) and, in its common state, step, layout and every rank's RNG.
  It loads at any TP / PP / DP layout.

This module is pure (torch, numpy, json; no megatron-core): the HF export, finding a distributed
checkpoint on disk, and RNG states that survive ``torch.load(weights_only=True)`` (megatron-core
reads ``common.pt`` that way) with the rule for restoring them at another layout (``pick_rng``).

Checkpoints of earlier versions (``trainer_rank<r>.pt`` per rank, same layout only) are not read:
``find_dist_checkpoint`` refuses them by name.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..torch_backend import MODEL_DIR, STATE_FILE, _copy_side_files

WEIGHTS_FILE = "model.safetensors"
DIST_DIR = "dist"  # the Megatron distributed checkpoint inside one iteration's directory
DIST_MARKER = "metadata.json"  # megatron-core's: {"sharded_backend": "torch_dist", ...}
DIST_BACKEND = "torch_dist"
# The layout keys of ``pick_rng`` (what a checkpoint's common state records as "layout"). "ep": the
# expert-parallel size changes which EP rank (and RNG stream) a rank is at the same coordinates;
# checkpoints saved before it was recorded ran at EP 1 (LAYOUT_DEFAULTS).
LAYOUT_KEYS = ("tp", "pp", "dp", "ep")
LAYOUT_DEFAULTS = {"ep": 1}


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
        try:
            state.update(load_file(str(file)))
        except Exception as exc:  # safetensors' errors do not say which file
            raise ValueError(f"cannot read {file}: {exc}") from exc
    return state


def model_dir(root: str | Path) -> Path:
    return Path(root) / MODEL_DIR


def dist_dir(root: str | Path) -> Path:
    return Path(root) / DIST_DIR


def is_dist_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a torch_dist checkpoint directory (megatron-core's metadata.json says so)."""
    marker = Path(path) / DIST_MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("sharded_backend") == DIST_BACKEND
    except (OSError, ValueError):
        return False


def find_dist_checkpoint(path: str | Path) -> Path:
    """The torch_dist checkpoint at ``path``: the directory itself (a converted checkpoint, a run's
    ``<iter>/dist``) or ``path/dist`` (a run's ``<iter>`` directory). FileNotFoundError saying what
    was found otherwise (nothing, another backend, or the per-rank files of an earlier version)."""
    root = Path(path)
    for candidate in (root, dist_dir(root)):
        if is_dist_checkpoint(candidate):
            return candidate
    if not root.is_dir():
        raise FileNotFoundError(f"no Megatron distributed checkpoint at {root}: the directory does not exist")
    if (root / STATE_FILE.format(rank=0)).exists():
        raise FileNotFoundError(
            f"no Megatron distributed checkpoint at {root}: it holds per-rank trainer_rank<r>.pt files of an "
            f"earlier rljob version, which this version does not read (start from its HF export "
            f"{model_dir(root)} instead)"
        )
    for candidate in (root, dist_dir(root)):
        marker = candidate / DIST_MARKER
        if marker.is_file():
            raise FileNotFoundError(
                f"no Megatron distributed checkpoint at {root}: {marker} does not name the "
                f"{DIST_BACKEND} backend: {marker.read_text()[:200]!r}"
            )
    raise FileNotFoundError(
        f"no Megatron distributed checkpoint at {root}: no {DIST_MARKER} there or in {dist_dir(root)} "
        f"(expected a torch_dist checkpoint: *.distcp, .metadata, common.pt, {DIST_MARKER})"
    )


# ------------------------------------------------------------------------------------------ RNG


def portable_rng_state(tracker: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """This process's RNG states in types ``torch.load(weights_only=True)`` accepts (numpy's state
    array as a list): python, numpy, torch CPU, every CUDA device, and Megatron's CUDA RNG tracker
    (``tracker``: ``get_cuda_rng_tracker().get_states()``, per TP rank; empty on CPU)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "tracker": {k: v.cpu() for k, v in (tracker or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: Mapping[str, Any], *, generators: bool = True) -> dict[str, torch.Tensor]:
    """Set python, numpy, torch and CUDA generators from ``portable_rng_state`` (when ``generators``);
    returns the Megatron tracker states for the caller to set (it owns the tracker)."""
    if generators:
        python = state["python"]
        random.setstate((python[0], tuple(python[1]), python[2]))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    return dict(state.get("tracker", {}))


def layout_of(layout: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(int(layout[k] if k in layout else LAYOUT_DEFAULTS[k]) for k in LAYOUT_KEYS)


def pick_rng(
    saved: Sequence[Mapping[str, Any]],
    saved_layout: Mapping[str, int],
    layout: Mapping[str, int],
    coords: Mapping[str, int],
) -> tuple[Mapping[str, Any], bool, str]:
    """Which saved RNG state a rank at ``coords`` (tp_rank, pp_rank, dp_rank) of ``layout`` restores.

    ``saved``: one entry per saved global rank, each with its coordinates and ``state``. Returns the
    entry's state, whether Megatron's tracker states apply to this rank, and how it was chosen:

    - same TP/PP/DP/EP sizes: the rank at the same coordinates, everything (exact);
    - another layout: the generators of saved global rank 0 (python, numpy, torch, CUDA: seeded alike
      on every rank, a rank's own stream has no counterpart in another layout); the tracker (its
      model-parallel stream is seeded per TP rank) of the saved rank with the same TP rank at PP and
      DP rank 0 when the TP size is unchanged (its expert-parallel stream is that rank's: with EP
      changed, not this rank's own, which only dropout inside experts would notice); otherwise the
      tracker keeps what the build seeded.
    """
    by_coords = {(e["tp_rank"], e["pp_rank"], e["dp_rank"]): e for e in saved}
    mine = (coords["tp_rank"], coords["pp_rank"], coords["dp_rank"])
    if layout_of(saved_layout) == layout_of(layout) and mine in by_coords:
        return by_coords[mine]["state"], True, "exact (same layout)"
    first = min(saved, key=lambda e: e["rank"])
    if int(saved_layout["tp"]) == int(layout["tp"]):
        peer = by_coords.get((coords["tp_rank"], 0, 0))
        if peer is not None:
            state = {**first["state"], "tracker": peer["state"].get("tracker", {})}
            return state, True, f"generators of saved rank 0, tracker of saved TP rank {coords['tp_rank']}"
    return first["state"], False, "generators of saved rank 0; tracker as seeded (TP size changed)"
