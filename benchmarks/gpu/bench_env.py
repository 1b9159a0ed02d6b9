"""What the GPU benchmarks share: the repo's packages on ``sys.path`` (they run from a checkout, as
``python3 benchmarks/gpu/<script>.py``), and the SGLang flags the project's GPU kit needs."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _path in (REPO / "runtime", REPO / "api", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# The kit's SGLang has no FA3 kernels (benchmarks/gpu/host/README.md): triton attention, torch
# sampling, no flashinfer autotune at start.
KIT_SGLANG_ARGS = {
    "attention-backend": "triton",
    "sampling-backend": "pytorch",
    "disable-flashinfer-autotune": "",
}
