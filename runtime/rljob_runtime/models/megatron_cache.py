"""Megatron conversions of ``model.path`` kept in the model cache, one per weights revision.

The operator runs ``rljob-runtime convert megatron-cache --model MODEL`` as a conversion job before
a megatron training job (``megatron_cache_job.py``); the job's ``prepare.prepare`` then
starts the trainer from the result (``model.megatronCheckpoint``). Layout:

- ``<cache_root()>/megatron/<source_key>/``: a torch_dist checkpoint (``hf-to-dist``'s output) plus
  the completion record ``rljob-conversion.json``, written into the staging directory before the
  rename: a directory without it is a leftover of an interrupted conversion and is never used.
- ``<cache_root()>/megatron/.<source_key>.lock`` (``cache.lock_path``): the file lock that makes jobs
  converting the same model at once (pods sharing resources.modelCache) convert it once.

``source_key`` names the weights' revision, so a model replaced in place gets a new conversion and
an unchanged one is reused. Pure except for reading the model directory and the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from rljob_api.pod_paths import RLJOB_CACHE

CACHE_DIR = "megatron"
RECORD = "rljob-conversion.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
_HUB_REPO_PREFIX = "models--"  # huggingface_hub's cache layout: models--Org--Name/snapshots/<commit>
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def cache_root() -> Path:
    """``$RLJOB_CACHE``, else the model cache's rljob/ directory the operator mounts in every pod."""
    return Path(os.environ.get("RLJOB_CACHE") or RLJOB_CACHE)


def _sanitize(name: str) -> str:
    return _UNSAFE.sub("_", name) or "model"


def _hub_key(model_dir: Path) -> str | None:
    """``Org--Name@<commit>`` for a hub snapshot directory: the commit names the files exactly."""
    snapshots, repo = model_dir.parent, model_dir.parent.parent
    if snapshots.name != "snapshots" or not repo.name.startswith(_HUB_REPO_PREFIX):
        return None
    name = repo.name.removeprefix(_HUB_REPO_PREFIX)
    return f"{_sanitize(name)}@{_sanitize(model_dir.name)}" if name and model_dir.name else None


def _weight_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file())


def _local_key(model_dir: Path) -> str:
    """``<name>-<16 hex>``: a hash of where the directory is, its weight files' names, sizes and
    mtimes, and its config, so a model replaced in place (new files, same path) gets a new key
    without reading the weights themselves."""
    real = Path(os.path.realpath(model_dir))
    digest = hashlib.sha256(os.fsencode(real))
    for path in _weight_files(real):
        stat = path.stat()  # follows symlinks: the file's own size and mtime
        digest.update(f"\0{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    digest.update(b"\0config.json\0" + (real / "config.json").read_bytes())
    return f"{_sanitize(real.name)}-{digest.hexdigest()[:16]}"


def source_key(model_dir: Path) -> str:
    """The directory name of ``model_dir``'s conversion (see ``_hub_key`` and ``_local_key``)."""
    model_dir = Path(os.path.abspath(model_dir))
    return _hub_key(model_dir) or _local_key(model_dir)


def converted_dir(model_dir: Path) -> Path:
    return cache_root() / CACHE_DIR / source_key(model_dir)


def read_record(directory: Path) -> dict[str, Any] | None:
    """The completion record of a converted directory; None when it has none (or an unreadable one)."""
    try:
        record = json.loads((Path(directory) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_converted(path: Path) -> bool:
    return read_record(path) is not None


def make_record(model_dir: Path, summary: str, *, model: str | None = None) -> dict[str, Any]:
    """What ``rljob-conversion.json`` holds: the source, its key, when, and the read-back comparison."""
    return {
        "source": str(model_dir),
        "model": model if model is not None else str(model_dir),
        "key": source_key(model_dir),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "comparison": summary,
    }


def write_record(directory: Path, record: dict[str, Any]) -> None:
    (Path(directory) / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
