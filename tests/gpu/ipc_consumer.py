"""The engine's side of tests/gpu/test_cuda_ipc_codec.py, as its own process: reads one IPC payload
per stdin line, reads it back as the engine would (``sglang``: SGLang's own deserializer and
``FlattenedTensorBucket``; ``rljob``: our hf engine's decoder), answers one JSON line of exact
checksums per bucket (``sync/checksum.py``), after the copies are done."""

from __future__ import annotations

import base64
import json
import sys

import torch

from rljob_runtime.sync.checksum import checksums


def read(codec: str, payload: str) -> list[tuple[str, torch.Tensor]]:
    if codec == "sglang":
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        monkey_patch_torch_reductions()
        data = MultiprocessingSerializer.deserialize(payload)
        return FlattenedTensorBucket(
            flattened_tensor=data["flattened_tensor"], metadata=data["metadata"]
        ).reconstruct_tensors()
    from rljob_runtime.sync.cuda_ipc import decode_bucket

    return decode_bucket(base64.b64decode(payload))


def main() -> int:
    codec = sys.argv[1]
    torch.cuda.init()
    for line in sys.stdin:
        if line.strip() == "END":
            return 0
        named = read(codec, line.strip())
        sums = {name: list(value) for name, value in checksums((n, t.clone()) for n, t in named).items()}
        torch.cuda.synchronize()
        del named
        print("RESULT " + json.dumps(sums), flush=True)  # SGLang may print to stdout too
    return 0


if __name__ == "__main__":
    sys.exit(main())
