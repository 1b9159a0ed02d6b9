"""Colocated CUDA IPC weight sync on one GPU: after each sync every engine parameter equals the
producer's, bit for bit (checksums and full comparison).

Runs ``benchmarks/gpu/weight_sync_ipc.py --check``: a producer process shares flattened buckets
(tiny Qwen3-style model, bf16 matrices + fp32 norms, 64 KiB buckets so there are many, one tensor
larger than a bucket), a second process loads them through the hf server's loader. No Ray needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu" / "weight_sync_ipc.py"


def test_engine_weights_equal_the_trainers_after_ipc_sync(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    assert result["checksums_equal"] and result["syncs"] == 2
    assert result["buckets"] > 3  # several bf16 buckets and an fp32 one
