"""Checkpoint conversions of the megatron backend: Hugging Face <-> Megatron distributed checkpoint
(megatron-core ``dist_checkpointing``, torch_dist backend), and a tensor-by-tensor check of a
conversion against its source. The command line is ``rljob-runtime convert`` (``convert_cli.py``);
the operator's conversion jobs build on these (``megatron_cache_job.py``, ``export.py``).

``hf_to_dist`` builds the Megatron GPTModel at TP 1 / PP 1 in one CPU process (gloo), loads the HF
weights (``model.load_hf_weights``: the same name and shape mapping the trainer uses) and saves
``{"model": sharded_state_dict}``: whole tensors, which the trainer loads at any layout (torch_dist
reshards on load), so ``tp`` / ``pp`` only check that the model splits over the layout the job will
use (heads, layers, MLP size), with the numbers, before anything is written. The weights keep their
dtype unless ``dtype`` says otherwise. The result is what ``model.megatronCheckpoint`` names.

``dist_to_hf`` reads a torch_dist checkpoint (a converted one, a run's ``iter_<n>/dist`` or the
``iter_<n>`` directory) into the same TP 1 / PP 1 model on CPU and writes its HF tensors (vocab
padding removed, qkv and gate/up split) as one ``model.safetensors`` with the model directory's
config, tokenizer and other non-weight files: a directory transformers and SGLang load. Tensors are
cast to ``dtype``, by default the config's ``torch_dtype`` (``dtype``), else the checkpoint's own.

Both write into a temporary directory next to ``out`` (``staging``), check what they wrote
(hf_to_dist reads its checkpoint back through the trainer's load path and compares every tensor with
the source; dist_to_hf re-reads its safetensors and compares them with the checkpoint's tensors) and
only then rename it to ``out`` (which must not exist). A failure removes the temporary directory and
names the tensor or file (``ConversionError``).

``verify`` compares a converted checkpoint (torch_dist or HF directory) with an HF directory: every
tensor's max abs difference (``Comparison``: the first tensor over ``atol``, default 0: exact, or
missing or of another shape). Run it after ``dist_to_hf`` of a fresh conversion, or after
``hf_to_dist`` (which runs it itself).

Everything runs on CPU (``cpu_world``: the command line hides GPUs from itself). Memory: the whole
model once as HF tensors plus once as the Megatron model (three times for dist_to_hf while writing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .convert import Tensors


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


def check_comparison(comparison: Comparison, what: str) -> None:
    """Raise ``ConversionError`` naming ``what`` and the first mismatch, when there is one."""
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

    from ...net import free_port

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
    from .checks import read_hf_config

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


def tied_alias(shape: Any) -> tuple[str, ...]:
    """Names a comparison ignores: transformers may write a tied model's lm_head.weight (an alias of
    the embedding), not a tensor of its own."""
    return ("lm_head.weight",) if shape.tied_embeddings else ()


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
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


def staging_leftovers(out: Path) -> list[Path]:
    """Staging directories of ``staging(out)`` that an interrupted process left behind."""
    return sorted(out.parent.glob(f".{out.name}.tmp-*")) if out.parent.is_dir() else []


def remove_leftover(path: Path) -> None:
    """Remove what an interrupted conversion left at ``path`` (a directory, a file or a link)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def check_layout(model_dir: Path, tp: int, pp: int) -> Any:
    """The model's shape, once it is known to split over the job's layout (numbers named)."""
    from .arch import model_shape
    from .parallel import validate_parallelism

    shape = model_shape(_read_config(model_dir))
    validate_parallelism(shape, tp=tp, pp=pp, gpus=tp * pp)
    return shape


def _megatron_model(shape: Any, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The whole model as one rank (TP 1, PP 1) on CPU, inside ``cpu_world``."""
    from .model import build_gpt_model, init_model_parallel
    from .parallel import Parallelism

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
    from .arch import model_shape
    from .checkpoint import find_dist_checkpoint
    from .dist_checkpoint import load_model_weights
    from .model import export_hf_weights

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
    from .checkpoint import read_hf_state
    from .dist_checkpoint import save_model
    from .model import load_hf_weights

    model_dir, out = Path(model_dir), Path(out)
    shape = check_layout(model_dir, tp, pp)  # the job's layout must fit (numbers named)
    hf = read_hf_state(model_dir)
    if "model.embed_tokens.weight" not in hf:
        raise ConversionError(f"{model_dir}: no tensor model.embed_tokens.weight in its safetensors")
    want = _dtype(dtype) or hf["model.embed_tokens.weight"].dtype
    with cpu_world(), staging(out) as tmp:
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
        result = compare(back, source, ignore=tied_alias(shape))
        check_comparison(result, f"hf-to-dist {model_dir} -> {out}: read back")
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
    from .checkpoint import read_hf_state, write_hf_model

    model_dir, out = Path(model_dir), Path(out)
    config = _read_config(model_dir)
    with cpu_world():
        named = read_dist_as_hf(checkpoint, model_dir)
    want = _dtype(dtype) or _config_dtype(config)
    if want is not None:
        named = {k: v.to(want) for k, v in named.items()}
    with staging(out) as tmp:
        write_hf_model(named, model_dir, tmp)
        result = compare(read_hf_state(tmp), named)
        check_comparison(result, f"dist-to-hf {checkpoint} -> {out}: written safetensors")
        if finish is not None:
            finish(tmp, result)
    return result


def verify(checkpoint: str | Path, model_dir: str | Path, *, atol: float = 0.0) -> Comparison:
    """Compare a converted checkpoint (torch_dist, or an HF directory) with the HF directory
    ``model_dir``, tensor by tensor (does not raise: see ``Comparison.mismatches``)."""
    from .arch import model_shape
    from .checkpoint import is_dist_checkpoint, read_hf_state

    source = read_hf_state(model_dir)
    path = Path(checkpoint)
    if is_dist_checkpoint(path) or is_dist_checkpoint(path / "dist"):
        with cpu_world():
            converted = read_dist_as_hf(path, model_dir)
    else:
        converted = read_hf_state(path)
    shape = model_shape(_read_config(model_dir))
    return compare(converted, source, atol=atol, ignore=tied_alias(shape))
