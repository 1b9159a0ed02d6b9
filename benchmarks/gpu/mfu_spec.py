"""The RLTrainingJob spec megatron_mfu.py builds its model from (pure: no megatron-core): its options
become a job's training fields (``spec_document``), or ``--from-spec`` takes a manifest's (``job_spec``),
and the result records what a job would set (``spec_training_fields``)."""

from __future__ import annotations

import argparse
from typing import Any

# --fusions: trainer/megatron/fusions.py's FUSIONS but "swiglu" (--swiglu), kept here so that parsing
# the arguments imports no megatron-core.
EXTRA_FUSIONS = ("wgrad", "norm", "rope")


def parse_fusions(text: str) -> tuple[str, ...]:
    """``--fusions``: comma-separated names from EXTRA_FUSIONS ("" or "none": none), sorted."""
    names = {n.strip() for n in text.split(",") if n.strip()} - {"none"}
    if unknown := sorted(names - set(EXTRA_FUSIONS)):
        raise argparse.ArgumentTypeError(f"unknown fusion(s) {unknown}; choose from {list(EXTRA_FUSIONS)}")
    return tuple(sorted(names))


def model_fusions(swiglu: str, fusions: tuple[str, ...]) -> frozenset[str]:
    """What build_gpt_model gets: --fusions plus "swiglu" unless --swiglu unfused."""
    return frozenset(fusions) | ({"swiglu"} if swiglu == "fused" else set())


def spec_document(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """The RLTrainingJob spec of a job that trains as these options ask (its training section is what
    the build reads; model and data are placeholders: the model is ``--models``' random one):
    --swiglu/--fusions -> training.fusions, --lm-head -> lmHead, --recompute full -> recomputeActivations
    (with --recompute-layers K: megatronArgs recompute-granularity full, recompute-method block,
    recompute-num-layers K, Megatron's names for the first K layers), --recompute selective ->
    megatronArgs recompute-granularity selective, --offload-optimizer -> offloadOptimizer, --tp ->
    parallelism.tensor, --micro-batch-size -> microBatchSize; a step's sequences are globalBatchSize."""
    if world % args.tp:
        raise ValueError(f"--tp {args.tp} does not divide the {world} ranks")
    step_samples = args.micro_batches * args.micro_batch_size * (world // args.tp)
    megatron_args: dict[str, str] = {}
    if args.recompute == "selective":
        megatron_args["recompute-granularity"] = "selective"
    elif args.recompute == "full" and args.recompute_layers is not None:
        megatron_args.update(
            {
                "recompute-granularity": "full",
                "recompute-method": "block",
                "recompute-num-layers": str(args.recompute_layers),
            }
        )
    training: dict[str, Any] = {
        "backend": "megatron",
        "globalBatchSize": step_samples,
        "microBatchSize": args.micro_batch_size,
        "parallelism": {"tensor": args.tp},
        "optimizer": {"lr": 1e-5, "clipGrad": 1.0},
        "fusions": sorted(model_fusions(args.swiglu, args.fusions)),
        "lmHead": args.lm_head,
        "recomputeActivations": args.recompute == "full" and args.recompute_layers is None,
        "megatronArgs": megatron_args,
        "offloadOptimizer": args.offload_optimizer,
    }
    return {
        "model": {"path": "/benchmark/model", "dtype": "bfloat16"},
        "data": {"path": "/benchmark/prompts.jsonl"},
        "rollout": {"batchSize": step_samples, "nSamplesPerPrompt": 1, "maxResponseLen": args.seq},
        "training": training,
        "resources": {"device": "cuda", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": world}},
    }


def job_spec(args: argparse.Namespace, world: int) -> Any:
    """The spec the model is built from: ``--from-spec``'s manifest (or bare spec), as the runtime
    reads it, or ``spec_document``'s. Refuses what the benchmark does not time (another backend,
    pipeline or context parallelism) and a tensor size that does not divide the ranks."""
    from rljob_api.resource import parse_document, parse_spec
    from rljob_api.yaml_load import load

    if args.from_spec is None:
        return parse_spec(spec_document(args, world))
    spec, _ = parse_document(load(args.from_spec.read_text()))
    training = spec.training
    par = training.parallelism
    if training.backend != "megatron":
        raise ValueError(
            f"{args.from_spec}: training.backend {training.backend}; the benchmark times megatron"
        )
    if par.pipeline != 1 or par.context != 1:
        raise ValueError(
            f"{args.from_spec}: the benchmark runs tensor parallelism only (pipeline, context 1)"
        )
    if world % par.tensor:
        raise ValueError(
            f"{args.from_spec}: parallelism.tensor {par.tensor} does not divide the {world} ranks"
        )
    return spec


def recompute_mode(spec: Any) -> str | None:
    """The activation recompute a spec asks for: full, selective or None."""
    training = spec.training
    if training.recompute_activations:
        return "full"
    return training.megatron_args.get("recompute-granularity")


def spec_training_fields(spec: Any) -> dict[str, Any]:
    """The training fields the build reads, as the manifest spells them (with their defaults)."""
    training = spec.training
    return {
        "fusions": list(training.megatron_fusions()),
        "lmHead": "chunked" if training.chunked_lm_head() else "full",
        "recomputeActivations": training.recompute_activations,
        "megatronArgs": dict(training.megatron_args),
        "offloadOptimizer": training.offload_optimizer,
        "parallelism": {"tensor": training.parallelism.tensor},
        "microBatchSize": training.micro_batch_size,
    }
