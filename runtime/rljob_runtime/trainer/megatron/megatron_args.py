"""``training.megatronArgs``: the allow-listed Megatron options, parsed and mapped to the megatron-core
0.16.1 config fields they set (pure: no megatron-core import, no GPU).

The API names the options and their values (``rljob_api.spec_training.MEGATRON_ARG_VALUES``, whose CEL
rules refuse anything else at admission); this module says where each goes: ``TransformerConfig``
(through ``model.transformer_config(..., overrides=)``, so its ``__post_init__`` checks them) or
``DistributedDataParallelConfig`` (``MegatronOverrides.ddp_config``). No option targets
``OptimizerConfig``: its fields that work without TE/apex are the spec's own (lr, Adam, clipping).
``check_megatron_args`` repeats the admission checks in Python, naming the key, and adds what needs the
model (recompute-num-layers against the layers per pipeline stage), before any GPU work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from rljob_api.spec_training import MEGATRON_ARG_VALUES, MEGATRON_BOOL_VALUES, MEGATRON_INT_PATTERN

Config = Literal["transformer", "ddp"]
T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Where one option lands: a megatron-core config object and its field."""

    config: Config
    field: str
    why: str  # what it does here, for the docs and the reader


ALLOWED: dict[str, Target] = {
    "overlap-grad-reduce": Target(
        "ddp",
        "overlap_grad_reduce",
        "start each gradient bucket's data-parallel reduce during backward (hooks per bucket)",
    ),
    "ddp-bucket-size": Target(
        "ddp",
        "bucket_size",
        "elements per gradient bucket (megatron-core ignores it without overlap_grad_reduce)",
    ),
    "check-for-nan-in-loss-and-grad": Target(
        "ddp",
        "check_for_nan_in_grad",
        "raise when a gradient bucket's norm is NaN or Inf, before its reduce (a NaN loss gives NaN grads)",
    ),
    "recompute-granularity": Target(
        "transformer",
        "recompute_granularity",
        "full: recompute whole layers in backward; selective: only the core attention",
    ),
    "recompute-method": Target(
        "transformer", "recompute_method", "full recompute: uniform (chunks of N layers) or block (first N)"
    ),
    "recompute-num-layers": Target("transformer", "recompute_num_layers", "N of recompute-method"),
}

if set(ALLOWED) != set(MEGATRON_ARG_VALUES):  # the API's list and this map must be the same options
    raise ImportError(
        f"megatron_args.ALLOWED {sorted(ALLOWED)} != rljob_api MEGATRON_ARG_VALUES {sorted(MEGATRON_ARG_VALUES)}"
    )


@dataclass(frozen=True)
class MegatronOverrides:
    """Parsed megatronArgs by config object: field name -> value."""

    transformer: dict[str, Any] = field(default_factory=dict)
    ddp: dict[str, Any] = field(default_factory=dict)

    def ddp_config(self, config: T) -> T:
        """``config`` (a DistributedDataParallelConfig) with the ddp overrides; ``replace`` rebuilds it,
        so its own checks run on the result."""
        return replace(config, **self.ddp) if self.ddp else config  # type: ignore[type-var]


def parse_value(name: str, raw: str) -> Any:
    """One option's value, as the API admits it; ValueError naming the option otherwise."""
    kind = MEGATRON_ARG_VALUES[name]
    if kind == "bool":
        if raw not in MEGATRON_BOOL_VALUES:
            raise ValueError(f"megatronArgs {name}: {raw!r} is not '' or 'true' (on) or 'false' (off)")
        return raw != "false"
    if kind == "int":
        if not re.fullmatch(MEGATRON_INT_PATTERN, raw):
            raise ValueError(f"megatronArgs {name}: {raw!r} is not a positive integer")
        return int(raw)
    if raw not in kind:
        raise ValueError(f"megatronArgs {name}: {raw!r} is not {' or '.join(kind)}")
    return raw


def overrides(args: Mapping[str, str]) -> MegatronOverrides:
    """megatronArgs -> the config fields they set. ValueError naming the unknown keys (with the allowed
    ones), a bad value, or a combination megatron-core would refuse or ignore later on the GPU."""
    unknown = sorted(set(args) - set(ALLOWED))
    if unknown:
        raise ValueError(
            f"megatronArgs {', '.join(unknown)}: not an option this runtime passes through; allowed: "
            f"{', '.join(ALLOWED)}"
        )
    values = {name: parse_value(name, raw) for name, raw in args.items()}
    out = MegatronOverrides()
    for name, value in values.items():
        target = ALLOWED[name]
        getattr(out, target.config)[target.field] = value
    _recompute(values, out.transformer)
    if "ddp-bucket-size" in values and not values.get("overlap-grad-reduce", False):
        raise ValueError("megatronArgs ddp-bucket-size needs overlap-grad-reduce (it is ignored without it)")
    return out


def _recompute(values: Mapping[str, Any], transformer: dict[str, Any]) -> None:
    """The three recompute fields together, as TransformerConfig wants them: full gets a method and a
    layer count (default uniform, 1: what recomputeActivations sets), selective neither."""
    granularity = values.get("recompute-granularity")
    if granularity is None:
        if {"recompute-method", "recompute-num-layers"} & set(values):
            raise ValueError(
                "megatronArgs recompute-method and recompute-num-layers need recompute-granularity full"
            )
        return
    if granularity == "selective" and {"recompute-method", "recompute-num-layers"} & set(values):
        raise ValueError(
            "megatronArgs recompute-method and recompute-num-layers need recompute-granularity full"
        )
    full = granularity == "full"
    transformer["recompute_method"] = values.get("recompute-method", "uniform") if full else None
    transformer["recompute_num_layers"] = values.get("recompute-num-layers", 1) if full else None


def check_megatron_args(
    args: Mapping[str, str], *, recompute_activations: bool, layers_per_stage: int
) -> MegatronOverrides:
    """``overrides`` plus what needs the spec and the model: recompute options only without
    recomputeActivations, recompute-num-layers within a pipeline stage's layers."""
    out = overrides(args)
    if recompute_activations and any(k.startswith("recompute-") for k in args):
        raise ValueError(
            "megatronArgs recompute-* set the recompute that recomputeActivations turns on: set "
            "recomputeActivations false to use them"
        )
    layers = out.transformer.get("recompute_num_layers")
    if layers is not None and layers > layers_per_stage:
        raise ValueError(
            f"megatronArgs recompute-num-layers {layers} exceeds the {layers_per_stage} layers of a "
            "pipeline stage"
        )
    return out
