"""training.fusions and training.lmHead in the megatron backend, on CPU (float32, gloo): the spec ->
``model_options`` mapping the rank and the MFU benchmark share; the chunked head's entropy (value and
gradient, beside the log-probs) equal to the full logits' over uneven chunks with vocabulary padding
and a temperature, on one rank and split over two tensor-parallel ranks; its weight-gradient fusion
into Megatron DDP's ``main_grad``; ``token_stats`` through the head equal to ``token_stats`` over the
logits, padded and packed; a MegatronTrainerRank with the chunked head (and the wgrad fusion) giving
the log-probs, reference log-probs, entropy, loss metrics and main gradients of one with the full
head, its ``token_stats`` going through the head in both passes; and the memory estimate's logits
term. Admission (CEL = Python): test_megatron_job_fields_admission.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from packing_cases import advantages_for, long_tail_samples
from spawned_ranks import spawn_ranks
from test_megatron_reshard import CONFIG, cpu_training, write_model

from rljob_api.spec import RLTrainingJobSpec
from rljob_api.spec_training import MEGATRON_FUSIONS
from rljob_runtime.trainer.base import TrainBatch, build_batch
from rljob_runtime.trainer.megatron.lm_head import ChunkedHead, chunked_token_stats
from rljob_runtime.trainer.megatron.policy import ModelOptions, model_options
from rljob_runtime.trainer.megatron.schedule import token_stats

VOCAB, PADDED, HIDDEN = 13, 16, 8


def spec_doc(model: str | Path = "/m", **training: Any) -> dict[str, Any]:
    return {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {"path": "/unused.jsonl", "maxPromptLength": 20},
        "algorithm": {"useKLLoss": True, "klLossCoef": 0.1, "entropyCoef": 0.01, "lossReduction": "token"},
        "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4, "maxResponseLen": 28},
        "training": {
            "backend": "megatron",
            "globalBatchSize": 8,
            "microBatchSize": 2,
            "optimizer": {"lr": 1e-3, "clipGrad": 0.0},
            **training,
        },
        "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 1}},
    }


def make_spec(model: str | Path = "/m", **training: Any) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(spec_doc(model, **training))


# ------------------------------------------------------------------------------ spec -> options


def test_unset_fields_give_every_fusion_and_the_chunked_head() -> None:
    options = model_options(make_spec())
    assert options.fusions == frozenset(MEGATRON_FUSIONS) == {"swiglu", "wgrad", "norm", "rope"}
    assert options.chunked_head and options.recompute is None
    assert options.megatron.transformer == {} and options.megatron.ddp == {}


def test_each_field_reaches_the_options() -> None:
    options = model_options(
        make_spec(
            fusions=["rope", "wgrad"],
            lmHead="full",
            megatronArgs={
                "recompute-granularity": "full",
                "recompute-method": "block",
                "recompute-num-layers": "2",
            },
        )
    )
    assert options == ModelOptions(
        fusions=frozenset({"rope", "wgrad"}),
        chunked_head=False,
        recompute=None,
        megatron=options.megatron,
    )
    assert options.megatron.transformer == {
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 2,
    }
    assert model_options(make_spec(fusions=[], lmHead="chunked")).fusions == frozenset()
    assert model_options(make_spec(recomputeActivations=True)).recompute == "full"


def test_the_rank_reads_the_spec_and_an_explicit_argument_overrides_it(model_dir: Path) -> None:
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    rank = MegatronTrainerRank(make_spec(model_dir, fusions=["norm"], lmHead="full"), str(model_dir))
    assert rank.options == model_options(rank.spec) and rank.fusions == {"norm"}
    assert not rank.options.chunked_head
    default = MegatronTrainerRank(make_spec(model_dir), str(model_dir))
    assert default.fusions == frozenset(MEGATRON_FUSIONS) and default.options.chunked_head
    assert MegatronTrainerRank(make_spec(model_dir), str(model_dir), fusions=()).fusions == frozenset()
    with pytest.raises(ValueError, match=r"unknown fusion\(s\) \['fast'\]"):
        MegatronTrainerRank(make_spec(model_dir), str(model_dir), fusions=["fast"])


def test_the_runtime_builds_exactly_the_fusions_the_api_names() -> None:
    from rljob_runtime.trainer.megatron import fusions

    assert frozenset(MEGATRON_FUSIONS) == fusions.FUSIONS


# ------------------------------------------------------------------------------- the head itself


def reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy of the full logits, in float64."""
    z = (hidden.double() @ weight.double().t())[..., :VOCAB] / temperature
    logp = torch.log_softmax(z, dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 5, HIDDEN, generator=gen)
    weight = torch.randn(PADDED, HIDDEN, generator=gen)
    weight[VOCAB:] = 50.0  # padding rows with large logits: must not count
    targets = torch.randint(0, VOCAB, (2, 5), generator=gen)
    up_logp, up_ent = torch.randn(2, 5, generator=gen), torch.randn(2, 5, generator=gen)
    return hidden, weight, targets, up_logp, up_ent


def values_and_grads(
    fn: Any, hidden: torch.Tensor, weight: torch.Tensor, up_logp: torch.Tensor, up_ent: torch.Tensor | None
) -> list[torch.Tensor]:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = fn(h, w)
    loss = (logp * up_logp).sum() + ((ent * up_ent).sum() if up_ent is not None else 0.0)
    loss.backward()
    return [logp.detach().double(), ent.detach().double(), h.grad.double(), w.grad.double()]  # type: ignore[union-attr]


NAMES = ("logp", "entropy", "grad hidden", "grad weight")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False], ids=["entropy-in-loss", "entropy-metric"])
def test_entropy_and_its_gradient_match_the_full_logits(temperature: float, entropy_grad: bool) -> None:
    hidden, weight, targets, up_logp, up_ent = inputs()
    chunk_bytes = 4 * PADDED * 3  # 3 tokens per chunk: 10 tokens = 3 + 3 + 3 + 1

    def ours(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent = chunked_token_stats(
            h, w, targets, vocab_size=VOCAB, temperature=temperature, chunk_bytes=chunk_bytes, entropy=True
        )
        assert ent is not None
        return logp, ent if entropy_grad else ent.detach()

    def theirs(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent = reference(h, w, targets, temperature)
        return logp, ent if entropy_grad else ent.detach()

    weigh = up_ent if entropy_grad else None
    got = values_and_grads(ours, hidden, weight, up_logp, weigh)
    want = values_and_grads(theirs, hidden, weight, up_logp, weigh)
    assert got[1].min() > 0  # entropies of real softmaxes
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), f"{name}: max diff {(a - b).abs().max():.3g}"
    assert got[3][VOCAB:].abs().max() == 0  # padding rows get no gradient


def test_without_entropy_there_is_none_and_the_log_probs_are_unchanged() -> None:
    hidden, weight, targets, _, _ = inputs()
    logp, ent = chunked_token_stats(hidden, weight, targets, vocab_size=VOCAB, chunk_bytes=4 * PADDED * 4)
    assert ent is None
    torch.testing.assert_close(
        logp.double(), reference(hidden, weight, targets, 1.0)[0], atol=1e-5, rtol=1e-5
    )


def test_fused_weight_gradient_goes_into_main_grad() -> None:
    """As Megatron's fused linears: the weight's gradient accumulates into main_grad (fp32) and autograd
    gets a placeholder DDP's hook skips, or zeros for a tied weight (its hook adds them)."""
    hidden, weight, targets, up_logp, up_ent = inputs()
    want = values_and_grads(lambda h, w: reference(h, w, targets, 0.9), hidden, weight, up_logp, up_ent)
    for tied in (False, True):
        w = weight.clone().requires_grad_()
        w.main_grad = torch.full(weight.shape, 0.5, dtype=torch.float32)  # type: ignore[attr-defined]
        w.grad_added_to_main_grad = False  # type: ignore[attr-defined]
        if tied:
            w.zero_out_wgrad = True  # type: ignore[attr-defined]
        head = ChunkedHead(w, fuse_wgrad=True, chunk_bytes=4 * PADDED * 3)
        h = hidden.clone().requires_grad_()
        logp, ent = head(h, targets, vocab_size=VOCAB, temperature=0.9, entropy=True)
        assert ent is not None
        ((logp * up_logp).sum() + (ent * up_ent).sum()).backward()
        assert w.grad_added_to_main_grad  # type: ignore[attr-defined]
        torch.testing.assert_close(w.main_grad.double() - 0.5, want[3], atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]
        torch.testing.assert_close(h.grad.double(), want[2], atol=1e-5, rtol=1e-5)  # type: ignore[union-attr]
        if tied:
            assert w.grad is not None and w.grad.abs().max() == 0
    with pytest.raises(ValueError, match="fuse_wgrad needs the weight's main_grad"):
        chunked_token_stats(hidden, weight, targets, vocab_size=VOCAB, fuse_wgrad=True)


def _tp_worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    hidden, weight, targets, up_logp, up_ent = inputs(seed=1)
    rows = slice(rank * PADDED // 2, (rank + 1) * PADDED // 2)  # rank 1: 5 real rows and the padding
    temperature = 0.8

    def ours(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent = chunked_token_stats(
            h,
            w,
            targets,
            vocab_size=VOCAB,
            temperature=temperature,
            group=dist.group.WORLD,
            chunk_bytes=96,
            entropy=True,
        )
        assert ent is not None
        return logp, ent

    got = values_and_grads(ours, hidden, weight[rows], up_logp, up_ent)
    want = values_and_grads(
        lambda h, w: reference(h, w, targets, temperature), hidden, weight, up_logp, up_ent
    )
    want[3] = want[3][rows]
    torch.save([(a - b).abs().max().item() for a, b in zip(got, want, strict=True)], f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.slow
def test_entropy_over_two_tensor_parallel_ranks(tmp_path: Path) -> None:
    out = str(tmp_path / "diff")
    spawn_ranks(_tp_worker, out)
    for rank in range(2):
        diffs = torch.load(f"{out}.{rank}")
        assert max(diffs) < 1e-5, f"rank {rank}: max diffs {dict(zip(NAMES, diffs, strict=True))}"


# ------------------------------------------------------------------------------------ token_stats


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("entropy", ["grad", "metric", None])
def test_token_stats_through_the_head_equals_token_stats_over_the_logits(
    packed: bool, entropy: str | None
) -> None:
    vocab, padded_vocab, width = 40, 48, 16
    mb: TrainBatch = build_batch(long_tail_samples(vocab)[:5])
    gen = torch.Generator().manual_seed(3)
    tokens = sum(mb.sequence_lengths()) if packed else int(mb.input_ids.shape[1])
    shape = (1, tokens, width) if packed else (mb.size, tokens, width)
    hidden = 0.5 * torch.randn(*shape, generator=gen)  # logits of a few units, as a model's
    weight = torch.randn(padded_vocab, width, generator=gen)
    upstream = torch.randn(mb.size, mb.width, generator=gen)
    out = {}
    for name in ("logits", "head"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if name == "logits":
            logp, ent = token_stats(h @ w.t(), mb, vocab, 0.8, entropy, packed=packed)
        else:
            head = ChunkedHead(w, chunk_bytes=4 * padded_vocab * 7)  # 7 tokens per chunk
            logp, ent = token_stats(h, mb, vocab, 0.8, entropy, packed=packed, head=head)
        assert logp.shape == (mb.size, mb.width)
        assert (ent is None) == (entropy is None)
        assert ent is None or ent.requires_grad == (entropy == "grad")
        loss = (logp * upstream).sum() + (ent.sum() if ent is not None and entropy == "grad" else 0.0)
        loss.backward()
        out[name] = [logp.detach(), ent.detach() if ent is not None else torch.zeros(()), h.grad, w.grad]
    for label, a, b in zip(NAMES, out["head"], out["logits"], strict=True):
        # fp32 both ways, summed in another order (entropy's gradient: sums of a vocabulary's terms)
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=label)
    assert out["head"][0].abs().sum() > 0


# ------------------------------------------------------------------------- the rank, chunked vs full


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("job-fields") / "hf")


@pytest.fixture()
def cpu_rank(cpu_megatron: None) -> Any:
    from rljob_runtime.trainer.megatron.checkpoint_convert import undo_patches

    undo = cpu_training()
    yield
    undo_patches(undo)


def one_step(model_dir: Path, lm_head: str, fusions: tuple[str, ...]) -> dict[str, Any]:
    """A rank built from the spec with ``lm_head`` (and ``fusions``, no compiled ones: CPU), its
    log-probs, then one optimizer step whose update is skipped (its main grads recorded), counting the
    calls of its chunked heads."""
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    spec = make_spec(model_dir, lmHead=lm_head, fusions=list(fusions))
    rank = MegatronTrainerRank(spec, str(model_dir), distributed_optimizer=False)
    assert rank.options.chunked_head == (lm_head == "chunked") and rank.options.fusions == set(fusions)
    rank.device = torch.device("cpu")
    rank._build()
    calls = {"policy": 0, "reference": 0}
    for key, attr in (("policy", "head"), ("reference", "ref_head")):
        head = getattr(rank, attr)
        assert (head is not None) == (lm_head == "chunked")
        if head is not None:
            assert head.fuse_wgrad == ("wgrad" in fusions and key == "policy")

            def counted(*args: Any, _head: ChunkedHead = head, _key: str = key, **kwargs: Any) -> Any:
                calls[_key] += 1
                return ChunkedHead.__call__(_head, *args, **kwargs)

            object.__setattr__(rank, attr, counted)  # what token_stats calls
    grads: dict[str, torch.Tensor] = {}

    def record() -> tuple[bool, float, None]:
        for name, p in rank.model.module.named_parameters():
            grads[name] = p.main_grad.detach().clone()
        return True, 0.0, None

    rank.optimizer.step = record
    batch = build_batch(long_tail_samples(CONFIG["vocab_size"]))
    lp = rank.logprobs(batch)
    after_logprobs = dict(calls)
    adv = advantages_for(batch.size, batch.width) * batch.loss_mask
    metrics = rank.train(batch, adv, lp.logp, lp.ref_logp)
    return {"lp": lp, "metrics": metrics, "grads": grads, "calls": after_logprobs, "all_calls": calls}


@pytest.mark.slow
@pytest.mark.parametrize("fusions", [(), ("wgrad",)], ids=["unfused", "wgrad"])
def test_chunked_head_rank_equals_full_head_rank(
    model_dir: Path, cpu_rank: None, fusions: tuple[str, ...]
) -> None:
    full = one_step(model_dir, "full", fusions)
    chunked = one_step(model_dir, "chunked", fusions)
    micro_batches = 4  # 8 rows, microBatchSize 2
    # token_stats went through the heads: policy and reference in the log-prob pass, policy in training
    assert chunked["calls"] == {"policy": micro_batches, "reference": micro_batches}
    assert chunked["all_calls"] == {"policy": 2 * micro_batches, "reference": micro_batches}
    assert full["all_calls"] == {"policy": 0, "reference": 0}
    for name in ("logp", "ref_logp", "entropy"):
        torch.testing.assert_close(
            getattr(chunked["lp"], name), getattr(full["lp"], name), rtol=1e-5, atol=1e-5, msg=name
        )
    assert chunked["metrics"]["ppo_kl"] == 0.0
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "tokens"):
        assert chunked["metrics"][key] == pytest.approx(full["metrics"][key], rel=1e-5, abs=1e-6), key
    assert set(chunked["grads"]) == set(full["grads"]) and full["grads"]
    for name, want in full["grads"].items():
        torch.testing.assert_close(chunked["grads"][name], want, rtol=1e-4, atol=1e-6, msg=name)
    assert full["grads"]["output_layer.weight"].abs().max() > 0  # the head's weight was trained


# --------------------------------------------------------------------------------- memory estimate


def test_the_chunked_head_shrinks_the_logits_estimate() -> None:
    from rljob_runtime.trainer.megatron import lm_head
    from rljob_runtime.trainer.megatron.arch import model_shape
    from rljob_runtime.trainer.megatron.memory_plan import (
        HEAD_CHUNK_BYTES,
        HEAD_CHUNKS,
        Knobs,
        alternatives,
        estimate,
        knobs_from_spec,
    )
    from rljob_runtime.trainer.megatron.parallel import Parallelism
    from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B

    assert HEAD_CHUNK_BYTES == lm_head.CHUNK_BYTES
    assert knobs_from_spec(make_spec(), Parallelism()).chunked_head
    assert not knobs_from_spec(make_spec(lmHead="full"), Parallelism()).chunked_head
    shape = model_shape(QWEN3_0_6B)
    knobs = Knobs(
        tp=1,
        pp=1,
        dp=1,
        micro_tokens=4096,
        recompute=False,
        offload_optimizer=False,
        reference=False,
        colocated=False,
    )
    full = estimate(shape, knobs)
    assert full.logits == 10 * 4096 * shape.vocab_size
    chunked = estimate(shape, Knobs(**{**knobs.__dict__, "chunked_head": True}))
    assert chunked.logits == HEAD_CHUNKS * HEAD_CHUNK_BYTES < full.logits
    assert chunked.total == full.total - full.logits + chunked.logits
    tiny = estimate(shape, Knobs(**{**knobs.__dict__, "chunked_head": True, "micro_tokens": 10}))
    assert tiny.logits == HEAD_CHUNKS * 4 * 10 * shape.vocab_size  # less than a chunk of tokens
    options = dict(alternatives(shape, knobs, gpus=1))
    assert options["training.lmHead: chunked"].logits == chunked.logits
    assert "training.lmHead: chunked" not in dict(
        alternatives(shape, Knobs(**{**knobs.__dict__, "chunked_head": True}), 1)
    )


@pytest.mark.slow
def test_a_rank_without_a_gpu_builds_no_default_fusions_but_the_named_ones(
    model_dir: Path, cpu_rank: None
) -> None:
    """Unset training.fusions means all four on GPUs; a CPU rank (these tests) skips compiling them."""
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    built = {}
    for name, fields in (("unset", {}), ("named", {"fusions": ["wgrad"]})):
        rank = MegatronTrainerRank(
            make_spec(model_dir, **fields), str(model_dir), distributed_optimizer=False
        )
        rank.device = torch.device("cpu")
        rank._build()
        built[name] = rank.fusions
    assert built == {"unset": frozenset(), "named": frozenset({"wgrad"})}
