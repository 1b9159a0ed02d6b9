"""The SGLang server flags the runtime sets itself, and which part of the spec governs each.

``rollout.sglangArgs`` may not set them (the API server refuses, naming the flag and the field to use
instead): the runtime owns where an engine listens, which GPUs it uses, its parallelism, the model it
loads, its seed per relaunch and its memory release. Keys are refused in both spellings (SGLang
accepts ``--model-path`` and argparse maps ``model_path`` the same way). A contract test checks every
flag here against the pinned SGLang's ``server_args.py``.
"""

from __future__ import annotations

RUNTIME_OWNED_SGLANG_FLAGS: dict[str, str] = {  # flag -> why, as the refusal says it
    "model-path": "the runtime sets it from model.path",
    "tokenizer-path": "the runtime sets it from model.tokenizer",
    "host": "the runtime picks the engine's address",
    "port": "the runtime picks a free port",
    "tp-size": "the runtime sets it from resources.rollout.gpusPerEngine",
    "tensor-parallel-size": "the runtime sets it from resources.rollout.gpusPerEngine",
    "dp-size": "engines are added with resources.rollout.gpus (one engine per gpusPerEngine GPUs)",
    "data-parallel-size": "engines are added with resources.rollout.gpus (one engine per gpusPerEngine GPUs)",
    "pp-size": "an engine is tensor parallel over resources.rollout.gpusPerEngine GPUs",
    "pipeline-parallel-size": "an engine is tensor parallel over resources.rollout.gpusPerEngine GPUs",
    "nnodes": "an engine runs on one node",
    "node-rank": "an engine runs on one node",
    "dist-init-addr": "an engine runs on one node",
    "base-gpu-id": "the runtime places the engine on its GPUs",
    "gpu-id-step": "the runtime places the engine on its GPUs",
    "enable-memory-saver": "the runtime turns it on when resources.colocate is true",
    "random-seed": "the runtime seeds each engine from training.seed",
    "dtype": "the runtime sets it from model.dtype",
    "trust-remote-code": "the runtime sets it from model.trustRemoteCode",
    "device": "the runtime sets it from resources.device",
    "api-key": "the runtime's requests carry no key",
    "admin-api-key": "the runtime's requests carry no key",
    "weight-version": "the runtime versions the weights it pushes",
    "enable-return-routed-experts": "the runtime sets it from training.routingReplay",
    "skip-server-warmup": "the runtime sets it (it waits for /health_generate itself)",
}


def spellings(flag: str) -> tuple[str, str]:
    """The kebab and snake spellings of a flag name."""
    return flag, flag.replace("-", "_")
