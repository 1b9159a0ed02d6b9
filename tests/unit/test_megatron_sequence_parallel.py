"""training.parallelism.sequenceParallel on the megatron backend, on CPU in float32 (gloo): tensor
parallel 2 with sequence parallelism gives the log-probs, entropy, reference log-probs, loss metrics
and every parameter gradient of tensor parallel 2 without it, with padded and with packed
(training.dynamicBatch) micro-batches, with the chunked LM head and with the full one. The rows'
lengths are odd, so the sequence is padded to a multiple of the two ranks (schedule.model_inputs).
The norms are then ``norms.RMSNorm`` (megatron-core's torch norms refuse sequence parallelism), their
weights marked so that megatron all-reduces their gradients over the tensor-parallel ranks: without
the mark (or with the padding's tokens counted) the gradients differ. One spawned pair of ranks runs
every case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from packing_cases import LENGTHS, long_tail_samples
from spawned_ranks import spawn_ranks
from test_dynamic_batch_megatron import make_spec, one_step, same_step
from test_megatron_reshard import CONFIG, cpu_training, trainer, write_model

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.trainer.base import build_batch

# LENGTHS with two responses a token shorter: the longest row is 39 tokens, odd.
ODD = tuple((p, r - 1) if p + r == 40 else (p, r) for p, r in LENGTHS)


def spec_for(
    model: Path, *, sequence_parallel: bool, dynamic: bool, head: str = "chunked"
) -> RLTrainingJobSpec:
    """The tensor-parallel-2 job of test_dynamic_batch_megatron with ``sequence_parallel`` and ``head``
    set on a copy, not validated again: admission refuses sequenceParallel until it has run on GPUs."""
    spec = make_spec(model, dynamic=dynamic, tp=2, gpus=2)
    training = spec.training
    parallelism = training.parallelism.model_copy(update={"sequence_parallel": sequence_parallel})
    return spec.model_copy(
        update={"training": training.model_copy(update={"parallelism": parallelism, "lm_head": head})}
    )


def one_step_odd(rank: Any, spec: RLTrainingJobSpec) -> dict[str, Any]:
    """test_dynamic_batch_megatron's one_step on the rows of ODD lengths (all of them on each rank: data
    parallel 1), with the padded width and each packed micro-batch's tokens."""
    out = one_step(rank, spec, lengths=ODD)
    batch = build_batch(long_tail_samples(CONFIG["vocab_size"], lengths=ODD))
    lengths = batch.sequence_lengths()
    rows = [range(len(lengths))[mb] if isinstance(mb, slice) else mb for step in out["plan"] for mb in step]
    return {
        **out,
        "width": int(batch.input_ids.shape[1]),
        "packed_tokens": [sum(lengths[i] for i in r) for r in rows],
    }


def _cases(model: Path, rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sp, head in (
        ("off", False, "chunked"),
        ("on", True, "chunked"),
        ("on-full-head", True, "full"),
    ):
        r = trainer(spec_for(model, sequence_parallel=sp, dynamic=False, head=head), model, rank, 2)
        gpt = r.model.module
        out[name] = {
            "config_sp": bool(gpt.config.sequence_parallel),
            "norms_marked": sorted(
                n
                for n, p in gpt.named_parameters()
                if "layernorm" in n and getattr(p, "sequence_parallel", False)
            ),
            "norms": sorted(n for n, _ in gpt.named_parameters() if "layernorm" in n),
            "padded": one_step_odd(r, spec_for(model, sequence_parallel=sp, dynamic=False, head=head)),
        }
        if head == "chunked":
            out[name]["packed"] = one_step_odd(
                r, spec_for(model, sequence_parallel=sp, dynamic=True, head=head)
            )
    return out


def lift_not_yet_on_gpus() -> None:
    """In this (spawned rank's) process: the support matrix without its refusal of sequenceParallel
    until it has run on GPUs; its other limits stay."""
    from rljob_api import support

    support.LIMITS = tuple(
        lim
        for lim in support.LIMITS
        if not (lim.field == ".training.parallelism.sequenceParallel" and "not yet shown on GPUs" in lim.what)
    )


def _two_ranks(rank: int, port: int, model_dir: str, out: str) -> None:
    lift_not_yet_on_gpus()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_training()
    torch.save(_cases(Path(model_dir), rank), Path(out) / f"result.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if torch.cuda.is_available():
        pytest.skip("CPU test")
    model = write_model(tmp_path_factory.mktemp("sp-megatron") / "hf")
    out = tmp_path_factory.mktemp("sp-two")
    spawn_ranks(_two_ranks, str(model), str(out))
    return [torch.load(out / f"result.{r}", weights_only=False) for r in range(2)]


def test_the_rows_need_padding_to_split_over_two_ranks(two_ranks: list[dict[str, Any]]) -> None:
    on = two_ranks[0]["on"]
    assert on["padded"]["width"] % 2 == 1
    assert any(n % 2 for n in on["packed"]["packed_tokens"])


def test_sequence_parallel_builds_marked_norms(two_ranks: list[dict[str, Any]]) -> None:
    for rank in two_ranks:
        assert not rank["off"]["config_sp"] and rank["off"]["norms_marked"] == []
        assert rank["on"]["config_sp"] and rank["on"]["norms_marked"] == rank["on"]["norms"] != []


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_sequence_parallel_gives_the_step_of_tensor_parallel_alone(
    two_ranks: list[dict[str, Any]], layout: str
) -> None:
    for rank in two_ranks:  # each rank's shard of the gradients
        same_step(rank["off"][layout], rank["on"][layout])


def test_with_the_full_lm_head_too(two_ranks: list[dict[str, Any]]) -> None:
    for rank in two_ranks:
        same_step(rank["off"]["padded"], rank["on-full-head"]["padded"])
