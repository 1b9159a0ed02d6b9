"""Reads an offline W&B run back: the records of its ``run-<id>.wandb`` file.

wandb writes them in its "datastore" format (LevelDB's log format behind a 7-byte ':W&B' header:
32 KiB blocks of chunks, each a 7-byte header - crc32, length, type FULL/FIRST/MIDDLE/LAST - then
data) holding protobuf ``Record``s. wandb no longer ships a Python reader (its core is in Go), so
the tests read the file here, with wandb's own protobuf classes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"not a W&B run file (header {ident!r})"
    at, pending = 7, b""
    while at + _CHUNK_HEADER <= len(data):
        left_in_block = _BLOCK - at % _BLOCK
        if left_in_block < _CHUNK_HEADER:  # block trailer: padding
            at += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + _CHUNK_HEADER])
        chunk = data[at + _CHUNK_HEADER : at + _CHUNK_HEADER + length]
        at += _CHUNK_HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk


def records(run_file: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    out = []
    for raw in _chunks(run_file.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def run_file(wandb_dir: Path) -> Path:
    """The one offline run's .wandb file under a W&B directory (WANDB_DIR/wandb/offline-run-*/)."""
    (found,) = sorted(wandb_dir.glob("**/offline-run-*/run-*.wandb"))
    return found


def history(run: Path) -> dict[int, dict[str, float]]:
    """step -> the logged scalars of that step (W&B's own _step/_runtime/_timestamp left out)."""
    out: dict[int, dict[str, float]] = {}
    for record in records(run):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
        }
        out[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


def run_info(run: Path) -> Any:
    """The run record: project, display_name, run_id, config."""
    return next(r.run for r in records(run) if r.WhichOneof("record_type") == "run")
