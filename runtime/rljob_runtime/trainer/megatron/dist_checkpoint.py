"""Megatron distributed checkpoints of the megatron backend: ``megatron.core.dist_checkpointing`` with
the torch_dist backend, which any TP / PP / DP layout loads, whatever layout saved it.

A checkpoint directory holds torch.distributed.checkpoint files (``__<rank>_<n>.distcp``,
``.metadata``), ``common.pt`` (everything that is not a sharded tensor, written by global rank 0) and
megatron-core's ``metadata.json`` (``sharded_backend: torch_dist``, written last). Tensors are stored
with their global shapes as megatron-core's ``sharded_state_dict`` describes them (per-layer tensors
stacked over all layers, fc1 as gate and up halves), and each rank reads the slices its own layout
needs:

- the model: ``GPTModel.sharded_state_dict()``. The embedding and untied output layer are padded to a
  vocab multiple of 128 x TP (``parallel.padded_vocab_size``), so their stored row counts depend on
  the saving TP size; megatron-core loads them with ``allow_shape_mismatch`` (the padding rows are
  never trained: zeros either way).
- the optimizer: the Megatron optimizer's ``sharded_state_dict(model_sd)``: Adam moments and fp32
  main parameters per model parameter, with the parameter's shape and sharding, keyed
  ``optimizer.state.<kind>.<parameter key>``: the plain optimizers (``distributed_optimizer=False``:
  CPU tests) by construction, the distributed optimizer in its ``fully_reshardable`` format, the one
  megatron-core 0.16 format that reshards in TP, PP and DP (``dp_reshardable`` only allows DP changes;
  megatron-core's default, ``fully_sharded_model_space``, fails in 0.16.1: "flattened_range is not
  supported").
  Its price: on save each rank gathers its model-parallel group's whole optimizer state (fp32 param
  and two moments: 12 bytes x parameters / (TP x PP)) into host memory, and on load each rank reads
  that much. The optimizer step is one common value (megatron-core refuses per-parameter steps).
- whatever common (non-tensor) state the caller adds: identical on every rank (megatron-core checks).

Saving is one collective in three agreed phases (``checkpoint.agree.write_agreed``: a rank whose
write fails still reaches the collective, and then every rank raises, ``CheckpointWriteError`` for
write failures): global rank 0 writes the caller's files (the HF export) and ``common.pt``; every
rank writes its shards (megatron-core broadcasts a failed shard write to every rank itself);
rank 0 writes ``metadata.json``. A directory without ``metadata.json`` is not a checkpoint.

Loading first compares the checkpoint's tensors (names and global shapes, from its ``.metadata``)
with what the model asks for, and refuses a mismatch naming the tensor and both shapes before any
tensor is read; every rank reads the same metadata, so every rank refuses alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.dist_checkpointing import ShardedTensor
from megatron.core.dist_checkpointing import load as dist_load
from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory
from megatron.core.dist_checkpointing.serialization import (
    get_default_save_common_strategy,
    get_default_save_sharded_strategy,
)
from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ...checkpoint.agree import dist_failures, write_agreed
from ...checkpoint.errors import CheckpointWriteError
from .checkpoint import DIST_BACKEND, find_dist_checkpoint
from .model import unwrap

StateDict = dict[str, Any]
OPTIMIZER_FORMAT = "fully_reshardable"  # see the module docstring
OPTIMIZER_PREFIX = "optimizer."  # keys of the optimizer's tensors (megatron-core's naming)


def sharding_metadata() -> dict[str, Any]:
    """The ``metadata`` every sharded_state_dict call of one save or load gets (the same both ways)."""
    return {
        "distrib_optim_sharding_type": OPTIMIZER_FORMAT,
        # No "chained_<i>." key prefix for a ChainedOptimizer: keys stay per model parameter.
        "chained_optim_avoid_prefix": True,
    }


def model_state(model: torch.nn.Module) -> StateDict:
    """The GPTModel's sharded state dict (inside DDP: megatron's DDP has none of its own)."""
    gpt: Any = unwrap(model)  # megatron-core's GPTModel: no types
    return dict(gpt.sharded_state_dict(metadata=sharding_metadata()))


def _keep_step_on_load(optimizer: Any) -> None:
    """Work around megatron-core 0.16.1's DistributedOptimizer without apex/TE: loading the
    fully_reshardable format copies every key of torch Adam's per-parameter state into place, "step"
    included, but hands over no "step" (load_state_dict has set it already from the param groups):
    KeyError. Here a missing "step" is the live one (copying it onto itself changes nothing).
    Installed on the instance, once."""
    if getattr(optimizer, "_rljob_keeps_step", False):
        return
    original = optimizer._set_main_param_and_optimizer_states

    def set_states(model_param: Any, tensors: dict[str, torch.Tensor]) -> None:
        live = optimizer._get_main_param_and_optimizer_states(model_param)
        if "step" in live and "step" not in tensors:
            tensors = {**tensors, "step": live["step"]}
        original(model_param, tensors)

    optimizer._set_main_param_and_optimizer_states = set_states
    optimizer._rljob_keeps_step = True


def trainer_state(model: torch.nn.Module, optimizer: Any, *, is_loading: bool) -> StateDict:
    """Model and optimizer, as one sharded state dict: ``{"model": ..., "optimizer": ...}``."""
    model_sd = model_state(model)
    if is_loading:
        for member in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
            if hasattr(member, "_init_optimizer_states_with_dummy_values") and not member.optimizer.state:
                # A DistributedOptimizer that never stepped has no Adam state, and without apex/TE its
                # state_dict() (called by sharded_state_dict) asserts one common step: allocate the
                # state with megatron-core's own zero-grad step (main params, moments and step are
                # all overwritten by the load).
                member._init_optimizer_states_with_dummy_values()
            if hasattr(member, "_set_main_param_and_optimizer_states"):
                _keep_step_on_load(member)
    optimizer_sd = optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=sharding_metadata())
    return {"model": model_sd, "optimizer": optimizer_sd}


def _failures() -> Callable[[bool], list[int]]:
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return dist_failures(device)


def save(
    directory: str | Path,
    sharded: StateDict,
    *,
    rank_zero_files: Callable[[], None] | None = None,
) -> None:
    """Write ``sharded`` (sharded tensors, and common values equal on every rank) to ``directory``, a
    collective of every rank (see the module docstring for the phases and what a failure raises).
    ``rank_zero_files``: more files global rank 0 writes in the first phase (the HF export)."""
    directory = Path(directory)
    rank = dist.get_rank()
    failures = _failures()
    strategy: Any = get_default_save_sharded_strategy(DIST_BACKEND)
    if ps.model_parallel_is_initialized() and ps.get_data_parallel_world_size() > 1:
        # Replicas over DP hold the same shards: spread their writes over the DP ranks (no data moves).
        strategy = FullyParallelSaveStrategyWrapper(
            strategy, ps.get_data_parallel_group(with_context_parallel=True)
        )
    parts: dict[str, Any] = {}

    def common() -> None:
        # Collective (metadata all-gather) and validated on rank 0 only: inside the agreed phase, so a
        # refusal there cannot leave the other ranks waiting in the next collective.
        parts["sharded"], parts["common"] = save_preprocess(sharded, validate_access_integrity=True)
        if rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            if rank_zero_files is not None:
                rank_zero_files()
            get_default_save_common_strategy().save_common(parts["common"], directory)

    def shards() -> None:
        try:
            strategy.save(parts["sharded"], directory)
        except CheckpointException as exc:  # megatron-core's collective report of a failed shard write
            raise CheckpointWriteError(f"torch_dist shards not written to {directory}: {exc}") from exc

    def marker() -> None:
        if rank == 0:
            save_config(CheckpointingConfig(strategy.backend, strategy.version), str(directory))

    # The first agreement is also the barrier before any rank writes into the directory rank 0 made.
    for phase in (common, shards, marker):
        write_agreed(phase, failures, rank=rank)


def checkpoint_tensors(directory: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of a torch_dist checkpoint: key -> global shape (read from its ``.metadata``)."""
    try:
        metadata = FileSystemReader(str(directory)).read_metadata()
    except Exception as exc:  # a missing or truncated .metadata: name the file
        raise ValueError(f"cannot read {Path(directory) / '.metadata'}: {exc}") from exc
    return {
        key: tuple(item.size)
        for key, item in metadata.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }


def _requested(sharded: StateDict) -> list[tuple[str, ShardedTensor]]:
    """(state-dict name, ShardedTensor) of every tensor ``sharded`` asks for (factories built)."""
    out: list[tuple[str, ShardedTensor]] = []

    def walk(node: Any, name: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{name}.{key}" if name else str(key))
        elif isinstance(node, list | tuple):
            for i, value in enumerate(node):
                walk(value, f"{name}.{i}")
        elif isinstance(node, ShardedTensorFactory):
            for built in nested_values(node.build()):
                if isinstance(built, ShardedTensor):
                    out.append((name, built))
        elif isinstance(node, ShardedTensor):
            out.append((name, node))

    walk(sharded, "")
    return out


def check_tensors(directory: str | Path, sharded: StateDict) -> None:
    """Refuse a checkpoint that lacks a tensor ``sharded`` asks for or holds it with another global
    shape (ValueError naming the tensor, its state-dict name and both shapes). Tensors megatron-core
    loads with ``allow_shape_mismatch`` (the vocab-padded embedding and output layer) only need their
    other dimensions to agree."""
    stored = checkpoint_tensors(directory)
    for name, tensor in _requested(sharded):
        key, want = tensor.key, tuple(tensor.global_shape)
        if key not in stored:
            what = "optimizer state" if key.startswith(OPTIMIZER_PREFIX) else "tensor"
            hint = (
                " (a model-only checkpoint, e.g. one hf-to-dist wrote, has no optimizer state: "
                "use it as model.megatronCheckpoint, not as a run checkpoint)"
                if key.startswith(OPTIMIZER_PREFIX)
                and not any(k.startswith(OPTIMIZER_PREFIX) for k in stored)
                else ""
            )
            raise ValueError(f"Megatron checkpoint {directory} has no {what} {key} (for {name}){hint}")
        have = stored[key]
        if tensor.allow_shape_mismatch:
            axis = tensor.prepend_axis_num  # the vocab axis of the local tensor
            if len(have) != len(want) or have[:axis] + have[axis + 1 :] != want[:axis] + want[axis + 1 :]:
                raise ValueError(
                    f"Megatron checkpoint {directory}: tensor {key} (for {name}) has shape {have}, this "
                    f"model's is {want} (only the vocab padding, dimension {axis}, may differ)"
                )
        elif have != want:
            raise ValueError(
                f"Megatron checkpoint {directory}: tensor {key} (for {name}) has shape {have}, this "
                f"model's is {want}"
            )


def load(directory: str | Path, sharded: StateDict) -> StateDict:
    """Read ``sharded`` from a torch_dist checkpoint (``directory`` or ``directory/dist``) into its
    tensors, after ``check_tensors``; returns megatron-core's loaded state dict (common values
    included). A read that fails later (a truncated shard file) is re-raised naming the directory."""
    found = find_dist_checkpoint(directory)
    check_tensors(found, sharded)
    try:
        return dict(dist_load(sharded, str(found)))
    except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
        damaged = damaged_files(found)
        cause = f"damaged files: {'; '.join(damaged)}" if damaged else str(exc).splitlines()[0]
        raise RuntimeError(f"reading Megatron checkpoint {found} failed: {cause}") from exc


def damaged_files(directory: str | Path) -> list[str]:
    """Shard files of a torch_dist checkpoint that are missing or shorter than its ``.metadata`` says
    (what a copy cut short or a full disk leaves), each with what is wrong."""
    directory = Path(directory)
    try:
        storage = FileSystemReader(str(directory)).read_metadata().storage_data
    except Exception as exc:
        return [f"{directory / '.metadata'} ({exc})"]
    needed: dict[str, int] = {}
    for info in storage.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    out = []
    for name, size in sorted(needed.items()):
        path = directory / name
        if not path.is_file():
            out.append(f"{path} is missing")
        elif path.stat().st_size < size:
            out.append(f"{path} has {path.stat().st_size} bytes, .metadata needs {size}")
    return out


def save_trainer_state(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: Any,
    common: Mapping[str, Any],
    *,
    rank_zero_files: Callable[[], None] | None = None,
) -> None:
    """Model, optimizer and ``common`` (equal on every rank) into ``directory`` (see ``save``)."""
    save(
        directory,
        {**trainer_state(model, optimizer, is_loading=False), **common},
        rank_zero_files=rank_zero_files,
    )


def load_trainer_state(directory: str | Path, model: torch.nn.Module, optimizer: Any) -> StateDict:
    """Restore model and optimizer from ``directory`` at this run's layout; returns the rest of the
    checkpoint's state (the common values ``save_trainer_state`` got)."""
    state = load(directory, trainer_state(model, optimizer, is_loading=True))
    unwrap(model).load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    return state


def load_model_weights(directory: str | Path, model: torch.nn.Module) -> None:
    """Only the model's weights (a converted checkpoint or a run's ``dist/``; optimizer state in it is
    ignored), at this run's layout."""
    state = load(directory, {"model": model_state(model)})
    unwrap(model).load_state_dict(state["model"])


def save_model(
    directory: str | Path, model: torch.nn.Module, common: Mapping[str, Any] | None = None
) -> None:
    """The model alone (what ``convert hf-to-dist`` writes)."""
    save(directory, {"model": model_state(model), **(common or {})})
