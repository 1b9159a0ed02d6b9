"""training.megatronArgs: each allowed option parses and reaches the megatron-core config field it names
(the real TransformerConfig / DistributedDataParallelConfig, built on CPU), and what is not allowed is
refused by name before any GPU work. Admission (CEL = Python) is covered by spec_cases' RULE_CASES."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rljob_api.resource import parse_spec
from rljob_api.spec_training import MEGATRON_ARG_VALUES
from rljob_runtime.trainer.megatron.arch import model_shape
from rljob_runtime.trainer.megatron.checks import check_layout
from rljob_runtime.trainer.megatron.megatron_args import (
    ALLOWED,
    check_megatron_args,
    overrides,
    parse_value,
)
from rljob_runtime.trainer.megatron.parallel import Parallelism
from rljob_runtime.trainer.megatron.testing import LLAMA_UNTIED

from spec_cases import patched

# option -> (megatronArgs that set it, the field's expected value). Companions are what the option needs.
CASES: dict[str, tuple[dict[str, str], Any]] = {
    "overlap-grad-reduce": ({"overlap-grad-reduce": ""}, True),
    "ddp-bucket-size": ({"overlap-grad-reduce": "true", "ddp-bucket-size": "12345678"}, 12345678),
    "check-for-nan-in-loss-and-grad": ({"check-for-nan-in-loss-and-grad": "true"}, True),
    "recompute-granularity": ({"recompute-granularity": "selective"}, "selective"),
    "recompute-method": ({"recompute-granularity": "full", "recompute-method": "block"}, "block"),
    "recompute-num-layers": ({"recompute-granularity": "full", "recompute-num-layers": "3"}, 3),
}


def test_every_allowed_option_has_a_case_and_the_api_lists_the_same() -> None:
    assert set(CASES) == set(ALLOWED) == set(MEGATRON_ARG_VALUES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_option_reaches_its_config_field(name: str) -> None:
    """Build the config object the option targets, as the backend does, and read the field back."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig

    from rljob_runtime.trainer.megatron.model import transformer_config

    args, expected = CASES[name]
    target = ALLOWED[name]
    out = overrides(args)
    if target.config == "ddp":
        base = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True
        )
        config: Any = out.ddp_config(base)
        assert getattr(base, target.field) != expected  # the option changes something
    else:
        shape = model_shape(LLAMA_UNTIED)
        config = transformer_config(
            shape, Parallelism(), dtype=torch.float32, cpu_init=True, overrides=out.transformer
        )
        plain = transformer_config(shape, Parallelism(), dtype=torch.float32, cpu_init=True)
        assert getattr(plain, target.field) != expected
    assert getattr(config, target.field) == expected


def test_recompute_options_set_what_the_tested_recompute_paths_set() -> None:
    """megatronArgs recompute equals model.transformer_config's own recompute settings, whose forward and
    backward test_megatron_sdpa_cpu runs on CPU (selective, full uniform, full block)."""
    pytest.importorskip("megatron.core")
    import torch

    from rljob_runtime.trainer.megatron.model import transformer_config

    shape = model_shape(LLAMA_UNTIED)
    fields = ("recompute_granularity", "recompute_method", "recompute_num_layers")

    def recompute_fields(**kwargs: Any) -> tuple[Any, ...]:
        config = transformer_config(shape, Parallelism(), dtype=torch.float32, cpu_init=True, **kwargs)
        return tuple(getattr(config, f) for f in fields)

    pairs = [
        ({"recompute-granularity": "selective"}, {"recompute": "selective"}),
        ({"recompute-granularity": "full"}, {"recompute": "full"}),
        (
            {"recompute-granularity": "full", "recompute-method": "block", "recompute-num-layers": "2"},
            {"recompute": "full", "recompute_layers": 2},
        ),
    ]
    for args, ours in pairs:
        assert recompute_fields(overrides=overrides(args).transformer) == recompute_fields(**ours), args


def test_ddp_overrides_go_through_the_configs_checks() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig

    base = DistributedDataParallelConfig()
    assert overrides({}).ddp_config(base) is base
    replaced = overrides({"overlap-grad-reduce": "", "ddp-bucket-size": "7"}).ddp_config(base)
    assert (replaced.overlap_grad_reduce, replaced.bucket_size, base.overlap_grad_reduce) == (True, 7, False)
    assert dataclasses.is_dataclass(replaced)


# ------------------------------------------------------------------------------ pure refusals


def test_unknown_options_are_named_with_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="megatronArgs use-distributed-optimizer, zz: not an option") as err:
        overrides({"zz": "", "use-distributed-optimizer": "", "overlap-grad-reduce": ""})
    assert "allowed: overlap-grad-reduce, ddp-bucket-size, " in str(err.value)


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("overlap-grad-reduce", "", True),
        ("overlap-grad-reduce", "true", True),
        ("overlap-grad-reduce", "false", False),
        ("ddp-bucket-size", "40000000", 40000000),
        ("recompute-method", "uniform", "uniform"),
    ],
)
def test_values_parse(name: str, raw: str, value: Any) -> None:
    assert parse_value(name, raw) == value


@pytest.mark.parametrize(
    ("name", "raw", "match"),
    [
        ("overlap-grad-reduce", "yes", "overlap-grad-reduce: 'yes' is not '' or 'true'"),
        ("ddp-bucket-size", "0", "ddp-bucket-size: '0' is not a positive integer"),
        ("ddp-bucket-size", "4e7", "not a positive integer"),
        ("recompute-num-layers", "-1", "not a positive integer"),
        ("recompute-granularity", "partial", "'partial' is not full or selective"),
    ],
)
def test_bad_values_are_refused_by_name(name: str, raw: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_value(name, raw)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"ddp-bucket-size": "100"}, "ddp-bucket-size needs overlap-grad-reduce"),
        ({"overlap-grad-reduce": "false", "ddp-bucket-size": "100"}, "needs overlap-grad-reduce"),
        ({"recompute-method": "block"}, "need recompute-granularity full"),
        (
            {"recompute-granularity": "selective", "recompute-num-layers": "2"},
            "need recompute-granularity full",
        ),
    ],
)
def test_combinations_megatron_would_refuse_or_ignore(args: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        overrides(args)


def test_recompute_against_the_spec_and_the_model() -> None:
    with pytest.raises(ValueError, match="set recomputeActivations false"):
        check_megatron_args({"recompute-granularity": "full"}, recompute_activations=True, layers_per_stage=4)
    with pytest.raises(ValueError, match="recompute-num-layers 3 exceeds the 2 layers"):
        check_megatron_args(
            {"recompute-granularity": "full", "recompute-num-layers": "3"},
            recompute_activations=False,
            layers_per_stage=2,
        )
    ok = check_megatron_args({"overlap-grad-reduce": ""}, recompute_activations=True, layers_per_stage=2)
    assert ok.ddp == {"overlap_grad_reduce": True} and ok.transformer == {}


def test_check_layout_refuses_what_does_not_fit_the_model() -> None:
    """check_megatron (prepare.prepare and every rank) runs this before any GPU work: LLAMA_UNTIED has 4
    layers, 2 per stage at pipeline 2."""
    doc = patched(
        {
            "training": {
                "parallelism": {"pipeline": 2},
                "megatronArgs": {"recompute-granularity": "full", "recompute-num-layers": "4"},
            }
        }
    )
    spec = parse_spec(doc)  # admitted: the API cannot know the model's layers
    with pytest.raises(ValueError, match="recompute-num-layers 4 exceeds the 2 layers"):
        check_layout(spec, LLAMA_UNTIED, gpus=2)
    doc["training"]["megatronArgs"]["recompute-num-layers"] = "2"
    check_layout(parse_spec(doc), LLAMA_UNTIED, gpus=2)
