"""The conversion command line, ``rljob-runtime convert`` (also ``python -m rljob_runtime.convert_cli``):

    rljob-runtime convert hf-to-dist --model HF_DIR --out DIST_DIR [--tp N --pp N] [--dtype D]
    rljob-runtime convert dist-to-hf --checkpoint DIST_DIR --model HF_DIR --out HF_OUT [--dtype D]
    rljob-runtime convert verify --checkpoint DIST_OR_HF_DIR --model HF_DIR [--atol X]
    rljob-runtime convert megatron-cache --model MODEL [--tp N --pp N]
    rljob-runtime convert export --checkpoints DIR --step N --out OUT [--model MODEL]

``hf-to-dist``, ``dist-to-hf`` and ``verify`` are the megatron backend's checkpoint conversions
(``trainer/megatron/checkpoint_convert.py``): each writes into a temporary directory next to
``--out`` (which must not exist), checks what it wrote tensor by tensor and only then renames it;
``verify`` exits 1 naming the first tensor over ``--atol`` (default 0: exact).

``megatron-cache`` (``megatron_cache_job.py``) and ``export`` (``export.py``) are what the operator's
conversion jobs run: their last line is the job's result, success or ``conversion failed: ...`` /
``export failed: ...`` naming the tensor or file, exit status 1.

Everything runs on CPU: the command hides GPUs from itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence

from .export import export_iteration
from .megatron_cache_job import convert_into_cache
from .trainer.megatron.checkpoint_convert import ConversionError, dist_to_hf, hf_to_dist, verify


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rljob-runtime convert",
        description="Hugging Face <-> Megatron torch_dist checkpoints (CPU), and a tensor-by-tensor check.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    h2d = sub.add_parser("hf-to-dist", help="HF directory -> Megatron torch_dist checkpoint")
    h2d.add_argument("--model", required=True, help="HF model directory (config.json + safetensors)")
    h2d.add_argument("--out", required=True, help="new directory for the torch_dist checkpoint")
    h2d.add_argument("--tp", type=int, default=1, help="tensor parallel size the job uses (checked only)")
    h2d.add_argument("--pp", type=int, default=1, help="pipeline parallel size the job uses (checked only)")
    h2d.add_argument("--dtype", help="store the weights in this dtype (default: as in the HF files)")
    d2h = sub.add_parser("dist-to-hf", help="Megatron torch_dist checkpoint -> HF directory")
    d2h.add_argument("--checkpoint", required=True, help="torch_dist directory (or a run's iter_<n>)")
    d2h.add_argument("--model", required=True, help="HF directory giving config, tokenizer and other files")
    d2h.add_argument("--out", required=True, help="new directory for the HF model")
    d2h.add_argument("--dtype", help="dtype of the written tensors (default: the config's torch_dtype)")
    ver = sub.add_parser("verify", help="compare a converted checkpoint with an HF directory")
    ver.add_argument("--checkpoint", required=True, help="torch_dist or HF directory to check")
    ver.add_argument("--model", required=True, help="the HF directory it should equal")
    ver.add_argument("--atol", type=float, default=0.0, help="largest abs difference allowed (default 0)")
    cache = sub.add_parser(
        "megatron-cache", help="model.path -> torch_dist in the model cache, once per revision"
    )
    cache.add_argument("--model", required=True, help="the job's model.path: a directory or a hub id")
    cache.add_argument("--tp", type=int, default=1, help="tensor parallel size the job uses (checked only)")
    cache.add_argument("--pp", type=int, default=1, help="pipeline parallel size the job uses (checked only)")
    exp = sub.add_parser("export", help="a run's saved iteration -> HF directory")
    exp.add_argument("--checkpoints", required=True, help="the run's checkpoint.path")
    exp.add_argument("--step", type=int, required=True, help="the iteration to export (iter_<step>)")
    exp.add_argument("--out", required=True, help="new directory for the HF model (parents are created)")
    exp.add_argument(
        "--model", help="the job's model.path, for config and tokenizer when the iteration has no model/"
    )
    return parser


# The failure line of each conversion job's command: the operator shows the last line in the status.
_JOB_FAILURE = {"megatron-cache": "conversion failed", "export": "export failed"}
_EXPECTED_ERRORS = (ConversionError, FileNotFoundError, ValueError, KeyError)


def _one_line(exc: BaseException) -> str:
    return " ".join((str(exc) or type(exc).__name__).split())[:1000]


def _job_command(args: argparse.Namespace) -> str:
    if args.command == "megatron-cache":
        return convert_into_cache(args.model, tp=args.tp, pp=args.pp)
    return export_iteration(args.checkpoints, args.step, args.out, model=args.model)


def _run_job_command(args: argparse.Namespace) -> int:
    """A conversion job's command: its result is one line, the last one, on success and on any failure."""
    try:
        line = _job_command(args)
    except Exception as exc:
        if not isinstance(exc, _EXPECTED_ERRORS):  # a bug or an environment problem: keep its traceback
            traceback.print_exc()
        sys.stdout.flush()  # what went to stdout before must not come after the reason
        print(f"{_JOB_FAILURE[args.command]}: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    print(line, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 on success; 1 with a one-line reason (the last line) on failure."""
    args = _parser().parse_args(argv)
    if args.command in _JOB_FAILURE:
        return _run_job_command(args)
    try:
        if args.command == "hf-to-dist":
            result = hf_to_dist(args.model, args.out, tp=args.tp, pp=args.pp, dtype=args.dtype)
            print(f"wrote {args.out}: {result.summary()}")
        elif args.command == "dist-to-hf":
            result = dist_to_hf(args.checkpoint, args.model, args.out, dtype=args.dtype)
            print(f"wrote {args.out}: {result.summary()}")
        else:
            result = verify(args.checkpoint, args.model, atol=args.atol)
            print(json.dumps({"max_abs_diff": result.max_abs_diff}, indent=1, sort_keys=True))
            problems = result.mismatches()
            print(result.summary())
            if problems:
                print(f"verify {args.checkpoint} against {args.model}: {problems[0]}", file=sys.stderr)
                return 1
    except (ConversionError, FileNotFoundError, ValueError, KeyError) as exc:
        print(f"{args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Before anything initialises CUDA: conversion is CPU work (gloo), whatever the node has.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.exit(main())
