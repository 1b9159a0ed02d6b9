"""Megatron GPTModel (loaded from HF weights) vs transformers: logits, token log-probs, export.

Run under torchrun, one process per GPU; every layout whose size divides the GPU count is tried,
data parallel over the rest (so TP=1 on 2 GPUs runs the same check on both). Per model, TP size and
dtype: max / mean abs diff of the logits and of the next-token log-probs, argmax agreement, and
whether exporting back to HF reproduces the loaded tensors bit-exactly. A layout that does not fit
the model is recorded with the refusal message. PP=2 is checked for the export round trip only.

    torchrun --nproc-per-node 2 benchmarks/gpu/megatron_equivalence.py --json /tmp/eq.json \\
        --models qwen3,qwen2,llama,smollm2 --tp 1,2 --pp 2

``smollm2`` reads the real SmolLM2-135M-Instruct weights through
``rljob_runtime.models.resolve.resolve_model`` (or ``--smollm2-dir``); the others are random-weight models of real shapes (``testing``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # benchmarks/bench_cli.py
try:
    import rljob_runtime  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path[:0] = [str(REPO / "runtime"), str(REPO / "api")]

from bench_cli import add_json, doc_parser  # noqa: E402

from rljob_runtime.algo.logprobs import token_logprobs  # noqa: E402
from rljob_runtime.trainer.megatron import model_shape, validate_parallelism  # noqa: E402
from rljob_runtime.trainer.megatron.model import (  # noqa: E402
    build_gpt_model,
    export_hf_weights,
    forward_logits,
    init_model_parallel,
    load_hf_weights,
)
from rljob_runtime.trainer.megatron.testing import (  # noqa: E402
    LLAMA_UNTIED,
    QWEN2_0_5B,
    QWEN3_0_6B,
    cpu_patches,
    random_hf_state,
    with_layers,
)

RANDOM_MODELS = {"qwen3": QWEN3_0_6B, "qwen2": QWEN2_0_5B, "llama": LLAMA_UNTIED}
TEXT = "The quick brown fox jumps over the lazy dog. What is 17 + 25? Let me think step by step: "


DEVICE = "cuda"


def load_model(
    name: str, smollm2_dir: str | None, layers: int | None
) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    """(HF config dict, fp32 HF state on the device, tokenizer or None)."""
    if name in RANDOM_MODELS:
        config = RANDOM_MODELS[name] if layers is None else with_layers(RANDOM_MODELS[name], layers)
        return config, random_hf_state(model_shape(config), seed=0, device=DEVICE), None
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from rljob_runtime.models.resolve import resolve_model
    from rljob_runtime.models.smollm2 import SMOLLM2_REF

    path = Path(smollm2_dir) if smollm2_dir else resolve_model(SMOLLM2_REF)
    config = json.loads((path / "config.json").read_text())
    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(file), device=DEVICE))
    return config, {k: v.float() for k, v in state.items()}, AutoTokenizer.from_pretrained(str(path))


def hf_model(config: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {
        k: v for k, v in config.items() if k not in ("architectures", "model_type", "transformers_version")
    }
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"HF load: missing {missing}, unexpected {unexpected}")
    return model.eval()


def token_batch(vocab: int, tokenizer: Any, rows: int = 4, length: int = 256) -> torch.Tensor:
    length = int(os.environ.get("EQ_SEQ_LEN", length))
    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(1234))
    if tokenizer is not None:  # one row of real text for the real model
        text = tokenizer(TEXT * 40)["input_ids"][:length]
        ids[0, : len(text)] = torch.tensor(text)
    return ids.to(DEVICE)


def compare(ours: torch.Tensor, theirs: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    ours, theirs = ours.float(), theirs.float()
    diff = (ours - theirs).abs()
    lp_ours = token_logprobs(ours[:, :-1], ids[:, 1:])
    lp_theirs = token_logprobs(theirs[:, :-1], ids[:, 1:])
    lp_diff = (lp_ours - lp_theirs).abs()
    return {
        "logits_max_abs_diff": float(diff.max()),
        "logits_mean_abs_diff": float(diff.mean()),
        "logits_mean_abs": float(theirs.abs().mean()),
        "logits_max_abs": float(theirs.abs().max()),
        "argmax_agreement": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()),
        "logp_max_abs_diff": float(lp_diff.max()),
        "logp_mean_abs_diff": float(lp_diff.mean()),
    }


def export_check(exported: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> list[str]:
    """Names whose exported tensor is not bit-identical to the loaded one (or missing/extra)."""
    bad = sorted(set(exported) ^ set(state))
    bad += [k for k in state if k in exported and not torch.equal(exported[k], state[k])]
    return bad


def run_case(
    name: str, config: dict[str, Any], state32: dict[str, torch.Tensor], tokenizer: Any, tp: int, world: int
) -> list[dict[str, Any]]:
    shape = model_shape(config)
    try:
        par = validate_parallelism(shape, tp=tp, gpus=world)
    except ValueError as err:
        return [{"model": name, "tp": tp, "refused": str(err)}]
    init_model_parallel(par)
    ids = token_batch(shape.vocab_size, tokenizer)
    rows = []
    exact: torch.Tensor | None = (
        None  # transformers' float32 logits: the bf16 rows are also measured against them
    )
    for dtype in (torch.float32, torch.bfloat16):
        state = {
            k: v.to(dtype)
            for k, v in state32.items()
            if not (shape.tied_embeddings and k == "lm_head.weight")
        }
        model = build_gpt_model(shape, par, dtype=dtype).eval()
        load_hf_weights(model, state, shape, par)
        reference = hf_model(config, state, dtype)
        with torch.no_grad():
            ours, theirs = forward_logits(model, ids, shape).float(), reference(input_ids=ids).logits.float()
        row: dict[str, Any] = compare(ours, theirs, ids)
        if exact is None:
            exact = theirs
        else:  # bf16's own error: transformers bf16 vs fp32, and ours vs transformers fp32
            for prefix, mine in (("hf_bf16_vs_fp32_", theirs), ("ours_vs_fp32_", ours)):
                full = compare(mine, exact, ids)
                row.update(
                    {
                        prefix + k: full[k]
                        for k in ("logits_max_abs_diff", "logits_mean_abs_diff", "logp_mean_abs_diff")
                    }
                )
        row.update(model=name, tp=tp, dp=par.dp, dtype=str(dtype).removeprefix("torch."), tokens=ids.numel())
        row["export_mismatches"] = export_check(export_hf_weights(model, shape, par), state)
        rows.append(row)
        del model, reference, ours
        if DEVICE.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def run_pp_export(
    name: str, config: dict[str, Any], state32: dict[str, torch.Tensor], pp: int, world: int
) -> dict[str, Any]:
    """Load with PP stages, export each stage, merge over the pipeline group: bit-exact?"""
    from megatron.core import parallel_state

    shape = model_shape(config)
    try:
        par = validate_parallelism(shape, pp=pp, gpus=world)
    except ValueError as err:
        return {"model": name, "pp": pp, "refused": str(err)}
    init_model_parallel(par)
    state = {
        k: v.to(torch.bfloat16)
        for k, v in state32.items()
        if not (shape.tied_embeddings and k == "lm_head.weight")
    }
    model = build_gpt_model(shape, par, dtype=torch.bfloat16)
    load_hf_weights(model, state, shape, par)
    stage = {k: v.cpu() for k, v in export_hf_weights(model, shape, par).items()}
    stages: list[Any] = [None] * pp
    dist.all_gather_object(stages, stage, group=parallel_state.get_pipeline_model_parallel_group())
    merged = {k: v for s in stages for k, v in s.items()}
    return {
        "model": name,
        "pp": pp,
        "dtype": "bfloat16",
        "export_mismatches": export_check(merged, {k: v.cpu() for k, v in state.items()}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--models", default="qwen3,qwen2,llama,smollm2")
    parser.add_argument("--tp", default="1,2", help="TP sizes to try (comma-separated)")
    parser.add_argument("--pp", default="2", help="PP sizes for the export round trip ('' for none)")
    parser.add_argument(
        "--smollm2-dir", default=None, help="HF dir of SmolLM2-135M(-Instruct); default: resolve_model"
    )
    add_json(parser, help="write the results here (rank 0)")
    parser.add_argument(
        "--layers", type=int, default=None, help="fewer layers for the random models (smoke runs)"
    )
    parser.add_argument("--cpu", action="store_true", help="smoke run on CPU (gloo, float32 only matters)")
    args = parser.parse_args(argv)

    global DEVICE
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        DEVICE = "cpu"
        cpu_patches()
        dist.init_process_group("gloo")
    else:
        DEVICE = f"cuda:{local_rank}"  # a bare "cuda" generator/device context means cuda:0 on every rank
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world = dist.get_world_size()
    results: list[dict[str, Any]] = []
    for name in args.models.split(","):
        config, state32, tokenizer = load_model(name, args.smollm2_dir, args.layers)
        for tp in (int(t) for t in args.tp.split(",") if t):
            results.extend(run_case(name, config, state32, tokenizer, tp, world))
        for pp in (int(p) for p in args.pp.split(",") if p):
            results.append(run_pp_export(name, config, state32, pp, world))
        del state32
    if dist.get_rank() == 0:
        device = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu"
        if args.json:
            args.json.write_text(
                json.dumps({"world_size": world, "device": device, "results": results}, indent=1)
            )
        print_table(results)
    dist.destroy_process_group()
    return 0


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        "| model | layout | dtype | logits max / mean abs diff | mean abs logit | argmax agree | logp max / mean abs diff "
        "| bf16 floor: HF bf16 vs fp32 logits mean diff / ours vs HF fp32 | export |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        layout = f"tp{r['tp']}" if "tp" in r else f"pp{r['pp']}"
        if "refused" in r:
            print(f"| {r['model']} | {layout} | - | refused: {r['refused']} | | | | | |")
            continue
        export = (
            "bit-exact"
            if not r["export_mismatches"]
            else f"{len(r['export_mismatches'])} differ: {r['export_mismatches'][:3]}"
        )
        if "logits_max_abs_diff" not in r:
            print(f"| {r['model']} | {layout} | {r['dtype']} | (export only) | | | | | {export} |")
            continue
        floor = "-"
        if "hf_bf16_vs_fp32_logits_mean_abs_diff" in r:
            floor = f"{r['hf_bf16_vs_fp32_logits_mean_abs_diff']:.3g} / {r['ours_vs_fp32_logits_mean_abs_diff']:.3g}"
        print(
            f"| {r['model']} | {layout} | {r['dtype']} | {r['logits_max_abs_diff']:.3g} / {r['logits_mean_abs_diff']:.3g} | "
            f"{r['logits_mean_abs']:.3g} | {r['argmax_agreement']:.4f} | {r['logp_max_abs_diff']:.3g} / {r['logp_mean_abs_diff']:.3g} | "
            f"{floor} | {export} |"
        )


if __name__ == "__main__":
    sys.exit(main())
