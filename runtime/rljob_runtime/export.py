"""Export of a run's saved iteration as a Hugging Face directory: what the operator's export
conversion jobs run (``rljob-runtime convert export --checkpoints DIR --step N --out OUT
[--model MODEL]``, ``convert_cli.py``).

``export_iteration`` writes the saved iteration N of a run as a Hugging Face directory at OUT:
dist-to-hf of ``iter_N/dist`` (megatron backend, ``trainer/megatron/checkpoint_convert.py``; the
result is compared with ``iter_N/model`` too) or a checked copy of ``iter_N/model`` (torch backend),
with the record ``rljob-export.json`` written last and the directory renamed into place; run again,
it reuses its own result. A step without the store's ``complete`` marker (``checkpoint/store.py``:
unfinished, or pruned by maxToKeep) is refused with the completed steps there.

Everything runs on CPU. It lives above ``checkpoint/`` (the lowest floor), as it uses the megatron
backend's conversions.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .trainer.megatron.checkpoint_convert import (
    Comparison,
    ConversionError,
    check_comparison,
    compare,
    dist_to_hf,
    remove_leftover,
    staging,
    staging_leftovers,
    tied_alias,
)

EXPORT_RECORD = "rljob-export.json"


def export_iteration(checkpoints: str | Path, step: int, out: str | Path, *, model: str | None = None) -> str:
    """Write the saved iteration ``step`` under ``checkpoints`` as an HF directory at ``out`` (see the
    module docstring); returns the line to print. A lock beside ``out`` serializes two exports to it."""
    from .models.cache import file_lock, lock_path

    root, out = Path(checkpoints), Path(os.path.abspath(out))
    with file_lock(lock_path(out)):
        if os.path.lexists(out):
            return _reused_export(out, root, step)
        iteration = _complete_iteration(root, step)
        for leftover in staging_leftovers(out):  # of an interrupted export to the same place
            remove_leftover(leftover)
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
    from .trainer.megatron.checks import read_hf_config

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
            ignore = tied_alias(model_shape(read_hf_config(config_dir)))
            against = compare(written, source, ignore=ignore)
            check_comparison(against, f"export {iteration.name} -> {out}: against {saved}")
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
    with staging(out) as tmp:
        shutil.copytree(saved, tmp, dirs_exist_ok=True)
        result = compare(read_hf_state(tmp), read_hf_state(saved))
        check_comparison(result, f"export {iteration.name} -> {out}: copy of {saved}")
        _export_record(tmp, root, step, "model", result.summary())
    return result.summary()
