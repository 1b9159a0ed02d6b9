# long-file: the conversion command line and its five subcommands; not yet moved under trainer/megatron/
"""Checkpoint conversion for the megatron backend: Hugging Face <-> Megatron distributed checkpoint
(megatron-core ``dist_checkpointing``, torch_dist backend), and a tensor-by-tensor check of a
conversion against its source.

    python -m rljob_runtime.convert hf-to-dist --model HF_DIR --out DIST_DIR [--tp N --pp N] [--dtype D]
    python -m rljob_runtime.convert dist-to-hf --checkpoint DIST_DIR --model HF_DIR --out HF_OUT [--dtype D]
    python -m rljob_runtime.convert verify --checkpoint DIST_OR_HF_DIR --model HF_DIR [--atol X]
    python -m rljob_runtime.convert megatron-cache --model MODEL [--tp N --pp N]
    python -m rljob_runtime.convert export --checkpoints DIR --step N --out OUT [--model MODEL]

``hf-to-dist`` builds the Megatron GPTModel at TP 1 / PP 1 in one CPU process (gloo), loads the HF
weights (``trainer/megatron/model.load_hf_weights``: the same name and shape mapping the trainer
uses) and saves ``{"model": sharded_state_dict}``: whole tensors, which the trainer loads at any
layout (torch_dist reshards on load), so ``--tp`` / ``--pp`` only check that the model splits over
the layout the job will use (heads, layers, MLP size), with the numbers, before anything is written.
The weights keep their dtype unless ``--dtype`` says otherwise. The result is what
``model.megatronCheckpoint`` names.

``dist-to-hf`` reads a torch_dist checkpoint (a converted one, a run's ``iter_<n>/dist`` or the
``iter_<n>`` directory) into the same TP 1 / PP 1 model on CPU and writes its HF tensors (vocab
padding removed, qkv and gate/up split) as one ``model.safetensors`` with ``--model``'s config,
tokenizer and other non-weight files: a directory transformers and SGLang load. Tensors are cast to
``--dtype``, by default the config's ``torch_dtype`` (``dtype``), else the checkpoint's own.

Both write into a temporary directory next to ``--out``, check what they wrote (hf-to-dist reads
its checkpoint back through the trainer's load path and compares every tensor with the source;
dist-to-hf re-reads its safetensors and compares them with the checkpoint's tensors) and only then
rename it to ``--out`` (which must not exist). A failure removes the temporary directory and names
the tensor or file (``ConversionError``).

``verify`` compares a converted checkpoint (torch_dist or HF directory) with an HF directory: every
tensor's max abs difference, exit status 1 naming the first tensor over ``--atol`` (default 0: exact)
or missing or of another shape. Run it after ``dist-to-hf`` of a fresh conversion, or after
``hf-to-dist`` (which runs it itself).

``megatron-cache`` and ``export`` are what the operator's conversion jobs run (their last line is the
job's result: success, or ``conversion failed: ...`` / ``export failed: ...`` naming the tensor or
file, exit status 1). ``megatron-cache`` resolves ``model.path`` (a hub id downloads into $HF_HOME)
and converts it once into the model cache (``models/megatron_cache.py``: one directory per weights
revision, reused by every later job, a file lock against two jobs converting it at once).
The conversion reads config.json and the safetensors and runs no model code (so it needs no
``trust_remote_code``). ``export`` writes the saved iteration N of a
run as a Hugging Face directory at OUT: dist-to-hf of ``iter_N/dist`` (megatron backend; the result
is compared with ``iter_N/model`` too) or a checked copy of ``iter_N/model`` (torch backend), with
the record ``rljob-export.json`` written last and the directory renamed into place; run again, it
reuses its own result.

Everything runs on CPU: the CLI hides GPUs from itself. Memory: the whole model once as HF tensors
plus once as the Megatron model (three times for dist-to-hf while writing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
EXPORT_RECORD = "rljob-export.json"


class ConversionError(RuntimeError):
    """A conversion or verification failed; the message names the tensor or file."""


# Called with the staging directory and the comparison once a conversion is checked, before the
# rename: what a caller adds there (a completion record) is in place when the directory appears.
Finish = Callable[[Path, "Comparison"], None]


# -------------------------------------------------------------------------------- comparison


@dataclass
class Comparison:
    """Tensors of a conversion against its source (HF names)."""

    max_abs_diff: dict[str, float] = field(default_factory=dict)  # tensors present in both, same shape
    missing: list[str] = field(default_factory=list)  # in the source, not in the conversion
    extra: list[str] = field(default_factory=list)  # in the conversion only
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)  # (got, source)
    atol: float = 0.0

    def mismatches(self) -> list[str]:
        """One line per problem, in source order for differing values."""
        lines = [f"{name}: missing in the conversion" for name in self.missing]
        lines += [f"{name}: shape {got} != source shape {want}" for name, (got, want) in self.shapes.items()]
        lines += [
            f"{name}: max abs diff {diff:.6g} > {self.atol:g}"
            for name, diff in self.max_abs_diff.items()
            if not diff <= self.atol  # NaN counts as a mismatch
        ]
        lines += [f"{name}: not in the source" for name in self.extra]
        return lines

    @property
    def ok(self) -> bool:
        return not self.mismatches()

    def summary(self) -> str:
        worst = max(self.max_abs_diff.items(), key=lambda kv: kv[1], default=("-", 0.0))
        return (
            f"{len(self.max_abs_diff)} tensors compared, max abs diff {worst[1]:.6g} ({worst[0]}), "
            f"{len(self.mismatches())} mismatches (atol {self.atol:g})"
        )


def compare(
    converted: Mapping[str, torch.Tensor],
    source: Mapping[str, torch.Tensor],
    *,
    atol: float = 0.0,
    ignore: Sequence[str] = (),
) -> Comparison:
    """Every tensor of ``source`` against ``converted`` by name: shape, then max abs difference of the
    values in float64 (dtypes may differ: a bf16 value held in fp32 compares equal). ``ignore``:
    names left out on both sides (a tied model's lm_head alias)."""
    out = Comparison(atol=atol)
    for name, want in source.items():
        if name in ignore:
            continue
        got = converted.get(name)
        if got is None:
            out.missing.append(name)
        elif tuple(got.shape) != tuple(want.shape):
            out.shapes[name] = (tuple(got.shape), tuple(want.shape))
        elif want.numel() == 0:
            out.max_abs_diff[name] = 0.0
        else:
            out.max_abs_diff[name] = float((got.double() - want.double()).abs().max())
    out.extra = sorted(set(converted) - set(source) - set(ignore))
    return out


def _check(comparison: Comparison, what: str) -> None:
    problems = comparison.mismatches()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConversionError(f"{what}: {problems[0]}{more}; {comparison.summary()}")


# ------------------------------------------------------------------------------ CPU megatron


def cpu_megatron_patches() -> list[tuple[Any, str, Any]]:
    """Let megatron-core 0.16 build, save and load a model on CPU: it reaches for CUDA for the rotary
    cache device, the TP RNG tracker, recompute's RNG state, and torch_dist's save (a device
    synchronize before writing, the failure flag's device). Returns what to restore
    (``undo_patches``). Process-wide: for conversion processes and CPU tests only."""
    from megatron.core.tensor_parallel import random as mp_random

    tracker = mp_random.get_cuda_rng_tracker()
    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "current_device", lambda: "cpu"),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (tracker, "fork", lambda *a, **k: contextlib.nullcontext()),
        (mp_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state()),
        (mp_random, "_set_cuda_rng_state", lambda *a, **k: None),
    ]
    undo = []
    for owner, name, value in patches:
        undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    return undo


def undo_patches(undo: list[tuple[Any, str, Any]]) -> None:
    for owner, name, value in reversed(undo):
        setattr(owner, name, value)


@contextlib.contextmanager
def cpu_world() -> Iterator[None]:
    """One CPU rank of megatron-core: a gloo process group of one (reused when one is up, e.g. in a
    test) and the CPU patches, undone after."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from .net import free_port

    if torch.cuda.is_available():
        raise ConversionError("conversion runs on CPU: hide the GPUs (CUDA_VISIBLE_DEVICES=; the CLI does)")
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}", rank=0, world_size=1
        )
    elif dist.get_world_size() != 1:
        raise ConversionError(f"conversion runs in one process, this one has {dist.get_world_size()} ranks")
    undo = cpu_megatron_patches()
    try:
        yield
    finally:
        undo_patches(undo)
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if owned:
            dist.destroy_process_group()


# ------------------------------------------------------------------------------------ helpers


def _read_config(model_dir: str | Path) -> dict[str, Any]:
    from .trainer.megatron.checks import read_hf_config

    return read_hf_config(model_dir)


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConversionError(
            f"--dtype {name!r} is not a torch floating point dtype (e.g. bfloat16, float32)"
        )
    return dtype


def _config_dtype(config: Mapping[str, Any]) -> torch.dtype | None:
    name = config.get("torch_dtype") or config.get("dtype")
    return _dtype(name) if isinstance(name, str) else None


def _tied_alias(shape: Any) -> tuple[str, ...]:
    # transformers may write a tied model's lm_head.weight (an alias of the embedding): not a tensor of its own.
    return ("lm_head.weight",) if shape.tied_embeddings else ()


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A fresh temporary directory next to ``out``, renamed to ``out`` when the block succeeds and
    removed when it fails. ``out`` must not exist (a conversion never overwrites)."""
    if os.path.lexists(out):
        raise ConversionError(f"{out} exists: give a new --out (a conversion never overwrites)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _staging_leftovers(out: Path) -> list[Path]:
    """Staging directories of ``_staging(out)`` that an interrupted process left behind."""
    return sorted(out.parent.glob(f".{out.name}.tmp-*")) if out.parent.is_dir() else []


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _check_layout(model_dir: Path, tp: int, pp: int) -> Any:
    """The model's shape, once it is known to split over the job's layout (numbers named)."""
    from .trainer.megatron.arch import model_shape
    from .trainer.megatron.parallel import validate_parallelism

    shape = model_shape(_read_config(model_dir))
    validate_parallelism(shape, tp=tp, pp=pp, gpus=tp * pp)
    return shape


def _megatron_model(shape: Any, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The whole model as one rank (TP 1, PP 1) on CPU, inside ``cpu_world``."""
    from .trainer.megatron.model import build_gpt_model, init_model_parallel
    from .trainer.megatron.parallel import Parallelism

    par = Parallelism()
    init_model_parallel(par)
    return build_gpt_model(shape, par, dtype=dtype), par


def _stored_dtype(checkpoint: Path) -> torch.dtype:
    """The dtype the checkpoint stores the embedding in (the model's parameter dtype when saved)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    item = metadata.get("embedding.word_embeddings.weight")
    if not isinstance(item, TensorStorageMetadata):
        raise ConversionError(
            f"{checkpoint}: no tensor embedding.word_embeddings.weight (not a GPT checkpoint?)"
        )
    return item.properties.dtype


# ------------------------------------------------------------------------------- conversions


def read_dist_as_hf(checkpoint: str | Path, model_dir: str | Path) -> Tensors:
    """A torch_dist checkpoint's model as HF tensors (model_dir gives the config), through the trainer's
    own load path at TP 1 / PP 1 (tensor names and shapes checked, naming the tensor). Inside ``cpu_world``."""
    from .trainer.megatron.arch import model_shape
    from .trainer.megatron.checkpoint import find_dist_checkpoint
    from .trainer.megatron.dist_checkpoint import load_model_weights
    from .trainer.megatron.model import export_hf_weights

    found = find_dist_checkpoint(checkpoint)
    shape = model_shape(_read_config(model_dir))
    model, par = _megatron_model(shape, _stored_dtype(found))
    try:
        load_model_weights(found, model)
    except (ValueError, RuntimeError) as exc:  # names the tensor (shapes) or the damaged file
        raise ConversionError(f"{exc} (model config: {Path(model_dir) / 'config.json'})") from exc
    return {k: v.detach() for k, v in export_hf_weights(model, shape, par).items()}


def hf_to_dist(
    model_dir: str | Path,
    out: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str | None = None,
    finish: Finish | None = None,
) -> Comparison:
    """Convert an HF directory to a torch_dist checkpoint at ``out`` (see the module docstring);
    returns the read-back comparison (exact unless ``dtype`` rounds)."""
    from .trainer.megatron.checkpoint import read_hf_state
    from .trainer.megatron.dist_checkpoint import save_model
    from .trainer.megatron.model import load_hf_weights

    model_dir, out = Path(model_dir), Path(out)
    shape = _check_layout(model_dir, tp, pp)  # the job's layout must fit (numbers named)
    hf = read_hf_state(model_dir)
    if "model.embed_tokens.weight" not in hf:
        raise ConversionError(f"{model_dir}: no tensor model.embed_tokens.weight in its safetensors")
    want = _dtype(dtype) or hf["model.embed_tokens.weight"].dtype
    with cpu_world(), _staging(out) as tmp:
        model, par = _megatron_model(shape, want)
        try:
            load_hf_weights(model, hf, shape, par)
        except (KeyError, ValueError) as exc:
            raise ConversionError(f"{model_dir}: {exc.args[0] if exc.args else exc}") from exc
        info = {"content": "model", "source": str(model_dir), "architecture": shape.architecture}
        save_model(tmp, model, {"rljob": info})
        del model
        back = read_dist_as_hf(tmp, model_dir)
        # The source as the checkpoint holds it: in each parameter's dtype (norms stay float32).
        source = {k: v.to(back[k].dtype) if k in back else v for k, v in hf.items()}
        result = compare(back, source, ignore=_tied_alias(shape))
        _check(result, f"hf-to-dist {model_dir} -> {out}: read back")
        if finish is not None:
            finish(tmp, result)
    return result


def dist_to_hf(
    checkpoint: str | Path,
    model_dir: str | Path,
    out: str | Path,
    *,
    dtype: str | None = None,
    finish: Finish | None = None,
) -> Comparison:
    """Convert a torch_dist checkpoint to an HF directory at ``out`` (see the module docstring); returns
    the comparison of the written safetensors with the checkpoint's tensors."""
    from .trainer.megatron.checkpoint import read_hf_state, write_hf_model

    model_dir, out = Path(model_dir), Path(out)
    config = _read_config(model_dir)
    with cpu_world():
        named = read_dist_as_hf(checkpoint, model_dir)
    want = _dtype(dtype) or _config_dtype(config)
    if want is not None:
        named = {k: v.to(want) for k, v in named.items()}
    with _staging(out) as tmp:
        write_hf_model(named, model_dir, tmp)
        result = compare(read_hf_state(tmp), named)
        _check(result, f"dist-to-hf {checkpoint} -> {out}: written safetensors")
        if finish is not None:
            finish(tmp, result)
    return result


def verify(checkpoint: str | Path, model_dir: str | Path, *, atol: float = 0.0) -> Comparison:
    """Compare a converted checkpoint (torch_dist, or an HF directory) with the HF directory
    ``model_dir``, tensor by tensor (does not raise: see ``Comparison.mismatches``)."""
    from .trainer.megatron.arch import model_shape
    from .trainer.megatron.checkpoint import is_dist_checkpoint, read_hf_state

    source = read_hf_state(model_dir)
    path = Path(checkpoint)
    if is_dist_checkpoint(path) or is_dist_checkpoint(path / "dist"):
        with cpu_world():
            converted = read_dist_as_hf(path, model_dir)
    else:
        converted = read_hf_state(path)
    shape = model_shape(_read_config(model_dir))
    return compare(converted, source, atol=atol, ignore=_tied_alias(shape))


# ------------------------------------------------------------------------ conversion jobs


def megatron_cache(model: str, *, tp: int = 1, pp: int = 1) -> str:
    """Convert ``model`` (model.path: a directory or a hub id) into the model cache unless a complete
    conversion of the same weights is there (``models/megatron_cache.py``); returns the line to print."""
    from .models import megatron_cache as cache
    from .models.cache import file_lock, lock_path
    from .models.resolve import resolve_model

    source = resolve_model(model)
    _check_layout(source, tp, pp)  # refused before waiting for a lock, reused or not
    target = cache.converted_dir(source)

    def waiting() -> None:
        print(f"waiting for another job converting {source} into {target}", flush=True)

    with file_lock(lock_path(target), on_wait=waiting):
        record = cache.read_record(target)
        if record is not None:
            return f"reused {target} (converted {record.get('converted_at', 'at an unknown time')})"
        # What an interrupted conversion left: a directory without its record, staging directories.
        for leftover in [target, *_staging_leftovers(target)]:
            if os.path.lexists(leftover):
                print(f"removing an incomplete conversion: {leftover}", flush=True)
                _remove(leftover)

        def finish(tmp: Path, result: Comparison) -> None:
            cache.write_record(tmp, cache.make_record(source, result.summary(), model=model))

        result = hf_to_dist(source, target, tp=tp, pp=pp, finish=finish)
    return f"converted {model} -> {target}: {result.summary()}"


def export_iteration(checkpoints: str | Path, step: int, out: str | Path, *, model: str | None = None) -> str:
    """Write the saved iteration ``step`` under ``checkpoints`` as an HF directory at ``out`` (see the
    module docstring); returns the line to print. A lock beside ``out`` serializes two exports to it."""
    from .models.cache import file_lock, lock_path

    root, out = Path(checkpoints), Path(os.path.abspath(out))
    with file_lock(lock_path(out)):
        if os.path.lexists(out):
            return _reused_export(out, root, step)
        iteration = _complete_iteration(root, step)
        for leftover in _staging_leftovers(out):  # of an interrupted export to the same place
            _remove(leftover)
        if (iteration / "dist").is_dir():
            kind, summary = "dist", _export_dist(iteration, out, root, step, model)
        else:
            kind, summary = "model", _export_model(iteration, out, root, step)
    return f"exported {iteration.name} ({kind}) -> {out}: {summary}"


def _export_record(tmp: Path, root: Path, step: int, kind: str, summary: str) -> None:
    from .checkpoint import store

    record = {
        "checkpoints": str(root.resolve()),
        "step": step,
        "iteration": store.iteration_dir(root, step).name,
        "source": kind,
        "summary": summary,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def _reused_export(out: Path, root: Path, step: int) -> str:
    """``reused OUT`` when ``out`` is this very export (a retried job); else refused, saying what it is."""
    from .checkpoint import store

    name = store.iteration_dir(root, step).name
    try:
        record = json.loads((out / EXPORT_RECORD).read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        found = f"it has no readable {EXPORT_RECORD}"
    elif record.get("step") == step and os.path.realpath(str(record.get("checkpoints"))) == os.path.realpath(
        root
    ):
        return f"reused {out}"
    else:
        found = f"it holds {record.get('iteration')} of {record.get('checkpoints')}"
    raise ConversionError(
        f"{out} exists and is not an export of {name} of {root} ({found}): remove it or set "
        "checkpoint.export.path"
    )


def _complete_iteration(root: Path, step: int) -> Path:
    """The iteration directory of ``step`` when the store's marker says it is complete; else refused
    with the completed steps that exist (older ones may have been pruned by maxToKeep)."""
    from .checkpoint import store

    iteration = store.iteration_dir(root, step)
    if (iteration / store.COMPLETE).is_file():
        return iteration
    if not root.is_dir():
        why = f"the checkpoint directory {root} does not exist"
    elif iteration.is_dir():
        why = f"{iteration} has no {store.COMPLETE} marker (a save that did not finish)"
    else:
        why = f"{iteration} does not exist"
    steps = ", ".join(str(s) for s in store.completed_steps(root)) or "none"
    raise ConversionError(
        f"{iteration.name} is not a complete checkpoint: {why}; completed steps under {root}: {steps} "
        "(checkpoint.maxToKeep prunes older ones)"
    )


def _export_dist(iteration: Path, out: Path, root: Path, step: int, model: str | None) -> str:
    """dist-to-hf of the iteration's dist/, also compared with its model/ export when it has one."""
    from .checkpoint import store
    from .models.resolve import resolve_model
    from .trainer.megatron.arch import model_shape
    from .trainer.megatron.checkpoint import read_hf_state

    saved = store.model_dir(iteration)
    if (saved / "config.json").is_file():
        config_dir = saved  # the config and tokenizer the run itself saved
    elif model:
        config_dir = resolve_model(model)
    else:
        raise ConversionError(
            f"{iteration} has no model/config.json: give --model (the job's model.path) for the config "
            "and tokenizer files"
        )
    summaries: list[str] = []

    def finish(tmp: Path, result: Comparison) -> None:
        summary = f"{result.summary()} against dist/"
        if any(saved.glob("*.safetensors")):
            written = read_hf_state(tmp)
            # model/ as the export holds it: cast to the export's dtype (the config's), then exact.
            source = {
                k: v.to(written[k].dtype) if k in written else v for k, v in read_hf_state(saved).items()
            }
            ignore = _tied_alias(model_shape(_read_config(config_dir)))
            against = compare(written, source, ignore=ignore)
            _check(against, f"export {iteration.name} -> {out}: against {saved}")
            summary += f"; {against.summary()} against model/"
        _export_record(tmp, root, step, "dist", summary)
        summaries.append(summary)

    dist_to_hf(iteration / "dist", config_dir, out, finish=finish)
    return summaries[0]


def _export_model(iteration: Path, out: Path, root: Path, step: int) -> str:
    """A copy of the iteration's model/ (torch backend), every tensor compared with the source."""
    from .checkpoint import store
    from .trainer.megatron.checkpoint import read_hf_state

    saved = store.model_dir(iteration)
    if not (saved / "config.json").is_file():
        raise ConversionError(f"{iteration} has neither dist/ nor model/config.json: nothing to export")
    with _staging(out) as tmp:
        shutil.copytree(saved, tmp, dirs_exist_ok=True)
        result = compare(read_hf_state(tmp), read_hf_state(saved))
        _check(result, f"export {iteration.name} -> {out}: copy of {saved}")
        _export_record(tmp, root, step, "model", result.summary())
    return result.summary()


# ------------------------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rljob_runtime.convert",
        description="Hugging Face <-> Megatron torch_dist checkpoints (CPU), and a tensor-by-tensor check.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    h2d = sub.add_parser("hf-to-dist", help="HF directory -> Megatron torch_dist checkpoint")
    h2d.add_argument("--model", required=True, help="HF model directory (config.json + safetensors)")
    h2d.add_argument("--out", required=True, help="new directory for the torch_dist checkpoint")
    h2d.add_argument("--tp", type=int, default=1, help="tensor parallel size the job uses (checked only)")
    h2d.add_argument("--pp", type=int, default=1, help="pipeline parallel size the job uses (checked only)")
    h2d.add_argument("--dtype", help="store the weights in this dtype (default: as in the HF files)")
    d2h = sub.add_parser("dist-to-hf", help="Megatron torch_dist checkpoint -> HF directory")
    d2h.add_argument("--checkpoint", required=True, help="torch_dist directory (or a run's iter_<n>)")
    d2h.add_argument("--model", required=True, help="HF directory giving config, tokenizer and other files")
    d2h.add_argument("--out", required=True, help="new directory for the HF model")
    d2h.add_argument("--dtype", help="dtype of the written tensors (default: the config's torch_dtype)")
    ver = sub.add_parser("verify", help="compare a converted checkpoint with an HF directory")
    ver.add_argument("--checkpoint", required=True, help="torch_dist or HF directory to check")
    ver.add_argument("--model", required=True, help="the HF directory it should equal")
    ver.add_argument("--atol", type=float, default=0.0, help="largest abs difference allowed (default 0)")
    cache = sub.add_parser(
        "megatron-cache", help="model.path -> torch_dist in the model cache, once per revision"
    )
    cache.add_argument("--model", required=True, help="the job's model.path: a directory or a hub id")
    cache.add_argument("--tp", type=int, default=1, help="tensor parallel size the job uses (checked only)")
    cache.add_argument("--pp", type=int, default=1, help="pipeline parallel size the job uses (checked only)")
    exp = sub.add_parser("export", help="a run's saved iteration -> HF directory")
    exp.add_argument("--checkpoints", required=True, help="the run's checkpoint.path")
    exp.add_argument("--step", type=int, required=True, help="the iteration to export (iter_<step>)")
    exp.add_argument("--out", required=True, help="new directory for the HF model (parents are created)")
    exp.add_argument(
        "--model", help="the job's model.path, for config and tokenizer when the iteration has no model/"
    )
    return parser


# The failure line of each conversion job's command: the operator shows the last line in the status.
_JOB_FAILURE = {"megatron-cache": "conversion failed", "export": "export failed"}
_EXPECTED_ERRORS = (ConversionError, FileNotFoundError, ValueError, KeyError)


def _one_line(exc: BaseException) -> str:
    return " ".join((str(exc) or type(exc).__name__).split())[:1000]


def _job_command(args: argparse.Namespace) -> str:
    if args.command == "megatron-cache":
        return megatron_cache(args.model, tp=args.tp, pp=args.pp)
    return export_iteration(args.checkpoints, args.step, args.out, model=args.model)


def _run_job_command(args: argparse.Namespace) -> int:
    """A conversion job's command: its result is one line, the last one, on success and on any failure."""
    try:
        line = _job_command(args)
    except Exception as exc:
        if not isinstance(exc, _EXPECTED_ERRORS):  # a bug or an environment problem: keep its traceback
            traceback.print_exc()
        sys.stdout.flush()  # what went to stdout before must not come after the reason
        print(f"{_JOB_FAILURE[args.command]}: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    print(line, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 on success; 1 with a one-line reason (the last line) on failure."""
    args = _parser().parse_args(argv)
    if args.command in _JOB_FAILURE:
        return _run_job_command(args)
    try:
        if args.command == "hf-to-dist":
            result = hf_to_dist(args.model, args.out, tp=args.tp, pp=args.pp, dtype=args.dtype)
            print(f"wrote {args.out}: {result.summary()}")
        elif args.command == "dist-to-hf":
            result = dist_to_hf(args.checkpoint, args.model, args.out, dtype=args.dtype)
            print(f"wrote {args.out}: {result.summary()}")
        else:
            result = verify(args.checkpoint, args.model, atol=args.atol)
            print(json.dumps({"max_abs_diff": result.max_abs_diff}, indent=1, sort_keys=True))
            problems = result.mismatches()
            print(result.summary())
            if problems:
                print(f"verify {args.checkpoint} against {args.model}: {problems[0]}", file=sys.stderr)
                return 1
    except (ConversionError, FileNotFoundError, ValueError, KeyError) as exc:
        print(f"{args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Before anything initialises CUDA: conversion is CPU work (gloo), whatever the node has.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.exit(main())
