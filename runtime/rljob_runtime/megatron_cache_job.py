"""The megatron-cache conversion job: ``model.path`` converted once into the model cache
(``rljob-runtime convert megatron-cache --model MODEL [--tp N --pp N]``, ``convert_cli.py``), which
the operator runs before a megatron training job.

``convert_into_cache`` resolves ``model.path`` (a hub id downloads into $HF_HOME) and converts it
(``trainer/megatron/checkpoint_convert.hf_to_dist``) into the model cache (``models/megatron_cache.py``: one
directory per weights revision, reused by every later job, a file lock against two jobs converting
it at once). The conversion reads config.json and the safetensors and runs no model code (so it
needs no ``trust_remote_code``). Everything runs on CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

from .trainer.megatron.checkpoint_convert import (
    Comparison,
    check_layout,
    hf_to_dist,
    remove_leftover,
    staging_leftovers,
)


def convert_into_cache(model: str, *, tp: int = 1, pp: int = 1) -> str:
    """Convert ``model`` (model.path: a directory or a hub id) into the model cache unless a complete
    conversion of the same weights is there (``models/megatron_cache.py``); returns the line to print."""
    from .models import megatron_cache as cache
    from .models.cache import file_lock, lock_path
    from .models.resolve import resolve_model

    source = resolve_model(model)
    check_layout(source, tp, pp)  # refused before waiting for a lock, reused or not
    target = cache.converted_dir(source)

    def waiting() -> None:
        print(f"waiting for another job converting {source} into {target}", flush=True)

    with file_lock(lock_path(target), on_wait=waiting):
        record = cache.read_record(target)
        if record is not None:
            return f"reused {target} (converted {record.get('converted_at', 'at an unknown time')})"
        # What an interrupted conversion left: a directory without its record, staging directories.
        for leftover in [target, *staging_leftovers(target)]:
            if os.path.lexists(leftover):
                print(f"removing an incomplete conversion: {leftover}", flush=True)
                remove_leftover(leftover)

        def finish(tmp: Path, result: Comparison) -> None:
            cache.write_record(tmp, cache.make_record(source, result.summary(), model=model))

        result = hf_to_dist(source, target, tp=tp, pp=pp, finish=finish)
    return f"converted {model} -> {target}: {result.summary()}"
