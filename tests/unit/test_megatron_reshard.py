"""Resharding resume of the megatron backend on CPU (gloo), a tiny untied Llama in float32 with a vocab
whose padding differs between TP 1 and TP 2 (300 -> 384 or 512 rows), the plain optimizer
(``distributed_optimizer=False``; megatron-core's optimizer and schedules make a few CUDA tensors
regardless, which ``cpu_training`` routes to the CPU in the test processes). The distributed optimizer
needs CUDA: ``test_distributed_optimizer_reshards_on_two_gpus`` (skipped without 2 GPUs) runs the
same chain through the GPU path.

One two-rank run (``_two_ranks``) chains the layouts: TP 2 trains a step and saves (checkpoint A),
then trains a second step (the uninterrupted run); TP 1 x DP 2 loads A, saves B and trains the second
step; PP 2 loads B and trains it; a save in which rank 1 cannot write fails on both ranks. In this
process, TP 1 on one rank loads A and trains it. Every resume must restore the gathered weights, fp32
main params and Adam moments exactly, and its second step must match the uninterrupted run's loss,
grad norm and updated weights within float32 tolerance (a resume that lost the moments moves the
weights by about lr: far outside it).

``model.megatronCheckpoint`` (a run's dist/ from another layout, and a converted checkpoint) gives the
same start as the HF weights, and a checkpoint that does not fit is refused naming the tensor.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist
from spawned_ranks import spawn_ranks

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.checkpoint.errors import CheckpointWriteError
from rljob_runtime.data.sample import Sample
from rljob_runtime.trainer.base import build_batch, rank_rows
from rljob_runtime.trainer.megatron import model_shape
from rljob_runtime.trainer.megatron.testing import LLAMA_UNTIED, random_hf_state, stored_tensors

CONFIG: dict[str, Any] = {
    **LLAMA_UNTIED,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}
ADV = torch.tensor([1.0, -0.5, 0.3, -1.0, 2.0, -1.0, 0.5, -0.2])
KINDS = ("main", "exp_avg", "exp_avg_sq")
LR = 1e-3


def write_model(dest: Path, config: dict[str, Any] = CONFIG, seed: int = 11) -> Path:
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config))
    save_file(random_hf_state(model_shape(config), seed=seed), str(dest / "model.safetensors"))
    return dest


def make_spec(
    model_dir: str | Path, *, tp: int = 1, pp: int = 1, kl: bool = False, dtype: str = "float32"
) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model_dir), "dtype": dtype},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {"useKLLoss": kl, "klLossCoef": 0.01, "lossReduction": "token"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4},
            "training": {
                "backend": "megatron",
                "globalBatchSize": 8,
                "microBatchSize": 2,
                "parallelism": {"tensor": tp, "pipeline": pp},
                "optimizer": {"lr": LR, "clipGrad": 1.0},
            },
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 2}},
        }
    )


@pytest.fixture()
def megatron_checkpoint_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's support matrix without its refusal of model.megatronCheckpoint, while it still has
    one (the API side accepts the field separately; nothing changes once it does)."""
    from rljob_api import support

    kept = tuple(limit for limit in support.LIMITS if limit.field != ".model.megatronCheckpoint")
    monkeypatch.setattr(support, "LIMITS", kept)


def with_megatron_checkpoint(spec: RLTrainingJobSpec, path: str | Path) -> RLTrainingJobSpec:
    """``spec`` with model.megatronCheckpoint set (a copy, not re-validated: see the fixture above)."""
    model = spec.model.model_copy(update={"megatron_checkpoint": Path(path)})
    return spec.model_copy(update={"model": model})


def make_samples() -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        prompt = torch.randint(0, CONFIG["vocab_size"], (3 + i % 3,), generator=gen).tolist()
        response = torch.randint(0, CONFIG["vocab_size"], (4 + i % 4,), generator=gen).tolist()
        out.append(
            Sample(
                group_index=i // 4, prompt_ids=prompt, response_ids=response, loss_mask=[1] * len(response)
            )
        )
    return out


def trainer(spec: RLTrainingJobSpec, model_dir: str | Path, rank: int = 0, world: int = 1) -> Any:
    """A MegatronTrainerRank built on CPU in the process group that is up (init_process_group is the
    GPU path: NCCL and a CUDA device)."""
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    rank_ = MegatronTrainerRank(
        spec, str(model_dir), rank=rank, world_size=world, distributed_optimizer=False
    )
    rank_.device = torch.device("cpu")
    rank_._build()
    return rank_


def step(rank_: Any, adv: torch.Tensor) -> dict[str, float]:
    """One optimizer step on this rank's rows of the 8 samples (logprobs first, as the driver does)."""
    from megatron.core import parallel_state as ps

    full = build_batch(make_samples())
    rows = rank_rows(full.size, 8, ps.get_data_parallel_world_size(), ps.get_data_parallel_rank())
    batch = full.select(rows)
    before = rank_.logprobs(batch)
    return rank_.train(batch, (adv[:, None] * full.loss_mask)[rows], before.logp, before.ref_logp)


def gathered_state(rank_: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Weights, fp32 main params and Adam moments as whole HF-named tensors (TP gathered, PP merged), on
    every rank. Collects from the optimizer's own objects, not through the checkpoint code."""
    from megatron.core import parallel_state as ps

    from rljob_runtime.trainer.megatron.convert import megatron_to_hf
    from rljob_runtime.trainer.megatron.model import unwrap
    from rljob_runtime.trainer.megatron.shard import from_stage, gather_tensor

    members = getattr(rank_.optimizer, "chained_optimizers", None) or [rank_.optimizer]
    by_param: dict[int, dict[str, torch.Tensor]] = {}
    for opt in members:
        if hasattr(opt, "float16_groups"):  # bf16 params with fp32 main copies
            pairs = list(zip(chain(*opt.float16_groups), chain(*opt.fp32_from_float16_groups), strict=True))
            pairs += [(p, p) for p in chain(*opt.fp32_from_fp32_groups)]
        else:  # fp32: the optimizer steps the model's parameters themselves
            pairs = [(p, p) for group in opt.optimizer.param_groups for p in group["params"]]
        for model_p, main_p in pairs:
            state = opt.optimizer.state[main_p]
            by_param[id(model_p)] = {
                "main": main_p,
                "exp_avg": state["exp_avg"],
                "exp_avg_sq": state["exp_avg_sq"],
            }
    shape, par = rank_.shape, rank_.par
    out: dict[str, dict[str, torch.Tensor]] = {}
    for kind in ("weights", *KINDS):
        stage: dict[str, torch.Tensor] = {}
        for name, param in unwrap(rank_.model).named_parameters():
            tensor = (param if kind == "weights" else by_param[id(param)][kind]).detach().float()
            if par.tp > 1:
                parts = [torch.empty_like(tensor) for _ in range(par.tp)]
                dist.all_gather(parts, tensor.contiguous(), group=ps.get_tensor_model_parallel_group())
                tensor = gather_tensor(name, parts)
            stage[name] = tensor.clone()
        hf = megatron_to_hf(from_stage(stage, shape, par.pp, ps.get_pipeline_model_parallel_rank()), shape)
        stages: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(stages, hf)
        out[kind] = {k: v for part in stages for k, v in part.items()}
    return out


class _CpuTensors:
    """``torch`` for megatron-core modules that make a few tensors with ``device="cuda"`` wherever the
    model lives (the optimizer's loss scale and found-inf flag, grad-norm buffers and the local
    multi-tensor l2 norm, the schedule's token count): those are made on the CPU instead."""

    FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "full"})

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if name not in self.FACTORIES:
            return value

        def on_cpu(*args: Any, **kwargs: Any) -> Any:
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return value(*args, **kwargs)

        return on_cpu


def _clip_grads(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """megatron-core's clip_grad_by_total_norm_fp32 without its assertion that grads are CUDA tensors."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff < 1.0 and grads:
        torch._foreach_mul_(grads, coeff)


def cpu_training() -> list[tuple[Any, str, Any]]:
    """Let megatron-core 0.16 train on CPU in this (test) process: the conversions' CPU patches
    (``checkpoint_convert``: current device, RNG tracker, synchronize) and the CUDA-only corners of the
    optimizer and schedules above. Returns what ``undo_patches`` restores."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer
    from megatron.core.pipeline_parallel import schedules

    from rljob_runtime.trainer.megatron.checkpoint_convert import cpu_megatron_patches

    undo = cpu_megatron_patches()
    patches = [
        (module, "torch", _CpuTensors(torch)) for module in (megatron_optimizer, clip_grads, schedules, utils)
    ]
    patches.append((megatron_optimizer, "clip_grad_by_total_norm_fp32", _clip_grads))
    for owner, name, value in patches:
        undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    return undo


# ------------------------------------------------------------------------------ two ranks (gloo)


def _failing_open(real_open: Any) -> Any:
    def fake(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(".distcp"):
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, *args, **kwargs)

    return fake


def _save_with_rank1_failing(r: Any, rank: int, path: Path) -> tuple[str, bool, str] | None:
    """Save with rank 1's writes failing: None if this rank's save returned, else (the exception's
    type, whether it is a CheckpointWriteError, its message)."""
    import builtins

    real_open = builtins.open
    if rank == 1:
        builtins.open = _failing_open(real_open)  # type: ignore[assignment]
    try:
        r.save(str(path))
        return None
    except Exception as exc:
        return (type(exc).__name__, isinstance(exc, CheckpointWriteError), str(exc))
    finally:
        builtins.open = real_open  # type: ignore[assignment]


def _two_ranks(rank: int, port: int, model_dir: str, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cpu_training()
    out: dict[str, Any] = {}
    base = Path(root)
    # TP 2: one step, checkpoint A, then the uninterrupted second step.
    a = trainer(make_spec(model_dir, tp=2), model_dir, rank, 2)
    out["m1"] = step(a, ADV)
    a.save(str(base / "A"))
    out["saved"] = gathered_state(a)
    out["m2"] = step(a, -ADV)
    out["after2"] = gathered_state(a)["weights"]
    # TP 1 x DP 2 from A (saving B), then PP 2 from B.
    for name, (tp, pp), source, save in (("dp2", (1, 1), "A", "B"), ("pp2", (1, 2), "B", None)):
        r = trainer(make_spec(model_dir, tp=tp, pp=pp), model_dir, rank, 2)
        r.load(str(base / source))
        res = {"loaded": gathered_state(r), "step": r.step, "layout": r.layout()}
        if save:
            r.save(str(base / save))
        res["m2"] = step(r, -ADV)
        res["after2"] = gathered_state(r)["weights"]
        out[name] = res
    # Rank 1 cannot write its shards: both ranks must raise, neither may wait for the other.
    out["failed"] = _save_with_rank1_failing(r, rank, base / "full")
    torch.save(out, base / f"result.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if torch.cuda.is_available():
        pytest.skip("CPU test (the GPU variant: test_distributed_optimizer_reshards_on_two_gpus)")
    root = tmp_path_factory.mktemp("reshard")
    model_dir = write_model(root / "hf")
    spawn_ranks(_two_ranks, str(model_dir), str(root))
    results = [torch.load(root / f"result.{r}", weights_only=False) for r in range(2)]
    return {"root": root, "model": model_dir, "ranks": results, **results[0]}


def assert_same_state(
    got: dict[str, dict[str, torch.Tensor]], want: dict[str, dict[str, torch.Tensor]]
) -> None:
    for kind in ("weights", *KINDS):
        assert sorted(got[kind]) == sorted(want[kind]), kind
        for name, tensor in want[kind].items():
            assert torch.equal(got[kind][name], tensor), f"{kind} {name}"


def assert_same_next_step(got: dict[str, Any], run: dict[str, Any], after2: dict[str, torch.Tensor]) -> None:
    for key in ("loss", "pg_loss", "grad_norm", "lr"):
        assert got["m2"][key] == pytest.approx(run["m2"][key], rel=1e-5, abs=1e-7), key
    worst = max(float((after2[k] - t).abs().max()) for k, t in run["after2"].items())
    moved = max(float((run["after2"][k] - t).abs().max()) for k, t in run["saved"]["weights"].items())
    assert moved > LR / 2  # the step moved the weights by about lr (Adam) ...
    assert worst < 2e-6, worst  # ... and the resumed one the same way, to float32 noise (an ulp at 1: 1.2e-7)


@pytest.mark.slow
def test_tp2_checkpoint_resumes_at_tp1_dp2_and_pp2(two_ranks: dict[str, Any]) -> None:
    saved = two_ranks["saved"]
    assert two_ranks["m1"]["skipped_step"] == 0.0
    assert sorted(saved["weights"]) == sorted(random_hf_state(model_shape(CONFIG)))
    assert all(saved["exp_avg_sq"][k].abs().sum() > 0 for k in saved["exp_avg_sq"])  # every tensor trained
    for name, layout in (("dp2", {"tp": 1, "pp": 1, "dp": 2}), ("pp2", {"tp": 1, "pp": 2, "dp": 1})):
        got = two_ranks[name]
        assert {k: got["layout"][k] for k in layout} == layout, name
        assert got["step"] == 1
        assert_same_state(got["loaded"], saved)
        assert_same_next_step(got, two_ranks, got["after2"])
    for rank in (0, 1):  # identical on both ranks (PP stages merged, DP replicas equal)
        assert_same_state(two_ranks["ranks"][rank]["pp2"]["loaded"], saved)


@pytest.mark.slow
def test_checkpoint_layout_keeps_the_hf_export(two_ranks: dict[str, Any]) -> None:
    from rljob_runtime.trainer.megatron.checkpoint import is_dist_checkpoint, read_hf_state

    for name in ("A", "B"):
        directory = two_ranks["root"] / name
        assert is_dist_checkpoint(directory / "dist")
        export = read_hf_state(directory / "model")  # what engines of a resumed run load
        assert (directory / "model" / "config.json").is_file()
        for key, tensor in two_ranks["saved"]["weights"].items():
            assert torch.equal(export[key], tensor), key
        assert not list(directory.glob("trainer_rank*.pt"))


@pytest.mark.slow
def test_a_rank_that_cannot_write_fails_the_save_on_every_rank(two_ranks: dict[str, Any]) -> None:
    failed = [two_ranks["ranks"][r]["failed"] for r in (0, 1)]
    assert all(f is not None for f in failed), failed
    assert all(is_write_error for _, is_write_error, _ in failed), failed
    assert any("No space left on device" in message for _, _, message in failed), (
        failed
    )  # the cause, on rank 0
    assert not (two_ranks["root"] / "full" / "dist" / "metadata.json").exists()  # not a checkpoint


# ------------------------------------------------------------------------ one rank, this process


@pytest.fixture()
def cpu_rank(cpu_megatron: None) -> Iterator[None]:
    """This process as one CPU rank (conftest's cpu_megatron) with the patches torch_dist needs."""
    from rljob_runtime.trainer.megatron.checkpoint_convert import undo_patches

    undo = cpu_training()
    yield
    undo_patches(undo)


@pytest.mark.slow
def test_tp2_checkpoint_resumes_on_one_rank(two_ranks: dict[str, Any], cpu_rank: None) -> None:
    model_dir = two_ranks["model"]
    r = trainer(make_spec(model_dir), model_dir)
    r.load(str(two_ranks["root"] / "A"))
    assert r.step == 1
    assert_same_state(gathered_state(r), two_ranks["saved"])
    got = {"m2": step(r, -ADV)}
    assert_same_next_step(got, two_ranks, gathered_state(r)["weights"])


@pytest.mark.slow
def test_megatron_checkpoint_start_equals_the_hf_start(
    two_ranks: dict[str, Any], cpu_rank: None, megatron_checkpoint_accepted: None, tmp_path: Path
) -> None:
    from rljob_runtime.trainer.megatron.checkpoint_convert import hf_to_dist

    model_dir = two_ranks["model"]
    hf_to_dist(model_dir, tmp_path / "converted")
    samples = build_batch(make_samples())
    runs = {}
    for name, source in (("hf", None), ("converted", tmp_path / "converted")):
        spec = make_spec(model_dir, kl=True)
        r = trainer(with_megatron_checkpoint(spec, source) if source else spec, model_dir)
        lp = r.logprobs(samples)
        runs[name] = (r.named_tensors(), lp, step(r, ADV))
    (w_hf, lp_hf, m_hf), (w_mc, lp_mc, m_mc) = runs["hf"], runs["converted"]
    assert sorted(w_hf) == sorted(w_mc) and all(torch.equal(w_hf[k], w_mc[k]) for k in w_hf)
    assert torch.equal(lp_hf.logp, lp_mc.logp) and torch.equal(lp_hf.ref_logp, lp_mc.ref_logp)
    assert m_hf == m_mc  # same weights, fresh optimizer: the same first step
    # A run's dist/ saved at TP 2 also serves: its weights, not the HF ones (the step moved them).
    r = trainer(with_megatron_checkpoint(make_spec(model_dir), two_ranks["root"] / "A" / "dist"), model_dir)
    weights = r.named_tensors()
    assert all(torch.equal(weights[k], t) for k, t in two_ranks["saved"]["weights"].items())
    assert r.step == 0  # weights only: a fresh optimizer and schedule


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_tensor(
    two_ranks: dict[str, Any], cpu_rank: None, megatron_checkpoint_accepted: None, tmp_path: Path
) -> None:
    from rljob_runtime.trainer.megatron.checkpoint_convert import hf_to_dist

    model_dir = two_ranks["model"]
    other = write_model(tmp_path / "wider", {**CONFIG, "intermediate_size": 128})
    hf_to_dist(other, tmp_path / "wider-dist")
    spec = with_megatron_checkpoint(make_spec(model_dir), tmp_path / "wider-dist")
    with pytest.raises(ValueError, match=r"tensor decoder\.layers\.mlp\.linear_fc\d\.weight .* has shape"):
        trainer(spec, model_dir)
    # A converted (model-only) checkpoint is not a run checkpoint: no optimizer state, said so.
    hf_to_dist(model_dir, tmp_path / "same-dist")
    r = trainer(make_spec(model_dir), model_dir)
    with pytest.raises(ValueError, match=r"no optimizer state optimizer\.state\..* model-only checkpoint"):
        r.load(str(tmp_path / "same-dist"))
    # No checkpoint there at all: refused before any process group (in the constructor).
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    with pytest.raises(FileNotFoundError, match="no Megatron distributed checkpoint at"):
        MegatronTrainerRank(with_megatron_checkpoint(make_spec(model_dir), tmp_path), str(model_dir))


# ------------------------------------------------------------------------ two GPUs (NCCL), real path

TIED = {**CONFIG, "tie_word_embeddings": True}  # PP 2 then keeps the embedding copies in sync (CUDA only)
# (optimizer format, model dtype, config): float32 compares to float32 noise, bfloat16 is the production path.
GPU_CHAINS = (("fully_reshardable", "float32", "tied"), ("fully_reshardable", "bfloat16", "untied"))


def _gpu_ranks(rank: int, port: int, root: str, chains: tuple[tuple[str, str, str], ...]) -> None:
    """The chain of ``_two_ranks`` through the GPU path: NCCL, MegatronTrainerRank.init_process_group,
    the distributed optimizer (each chain with its checkpoint format for it)."""
    import os
    import traceback

    from rljob_runtime.trainer.megatron import dist_checkpoint as dcp
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank

    os.environ["LOCAL_RANK"] = str(rank)  # the device init_process_group takes, as under torchrun
    torch.cuda.set_device(rank)
    base = Path(root)
    results: dict[str, Any] = {}

    def gpu_trainer(model_dir: Path, dtype: str, tp: int, pp: int) -> Any:
        spec = make_spec(model_dir, tp=tp, pp=pp, dtype=dtype)
        r = MegatronTrainerRank(spec, str(model_dir), rank=rank, world_size=2, dist_timeout_s=180)
        r.init_process_group("127.0.0.1", port)  # the first one starts NCCL, later ones reuse it
        return r

    for fmt, dtype, config in chains:
        name = f"{fmt}-{dtype}-{config}"
        model_dir, ckpt = base / config, base / name
        dcp.OPTIMIZER_FORMAT = fmt
        out: dict[str, Any] = {}
        try:
            a = gpu_trainer(model_dir, dtype, 2, 1)
            out["m1"] = step(a, ADV)
            a.save(str(ckpt / "A"))
            out["saved"] = a.named_tensors()
            out["m2"] = step(a, -ADV)
            out["after2"] = a.named_tensors()
            for layout, (tp, pp), source, save in (("dp2", (1, 1), "A", "B"), ("pp2", (1, 2), "B", None)):
                r = gpu_trainer(model_dir, dtype, tp, pp)
                r.load(str(ckpt / source))
                res = {"loaded": r.named_tensors(), "step": r.step}
                if save:
                    r.save(str(ckpt / save))
                res["m2"] = step(r, -ADV)
                res["after2"] = r.named_tensors()
                out[layout] = res
            out["failed"] = _save_with_rank1_failing(r, rank, ckpt / "full")
        except Exception:
            out["error"] = traceback.format_exc()
            print(f"rank {rank} {name}:\n{out['error']}", flush=True)
            break  # the ranks may now disagree on collectives: stop here
        finally:
            results[name] = out
    torch.save(results, base / f"gpu.{rank}")
    dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_distributed_optimizer_reshards_on_two_gpus(tmp_path: Path) -> None:
    """TP 2 -> TP 1 x DP 2 (saving again) -> PP 2 with the distributed optimizer: the checkpoint saved at
    TP 1 x DP 2 holds the same global tensors as the TP 2 one (model, fp32 main params, moments), the
    weights are restored exactly, and the resumed second step matches the uninterrupted one (float32:
    to float32 noise; bfloat16: all but a few weights equal, while the step moves them by about lr)."""
    write_model(tmp_path / "tied", TIED)
    write_model(tmp_path / "untied", CONFIG)
    spawn_ranks(_gpu_ranks, str(tmp_path), GPU_CHAINS)
    results = torch.load(tmp_path / "gpu.0", weights_only=False)
    for fmt, dtype, config in GPU_CHAINS:
        name = f"{fmt}-{dtype}-{config}"
        run = results.get(name, {})
        assert "error" not in run, f"{name}: {run.get('error')}"
        # B was saved at TP 1 x DP 2 right after loading A (saved at TP 2): the same global tensors,
        # model and optimizer (fp32 main params, moments), but for the vocab padding rows.
        a, b = stored_tensors(tmp_path / name / "A" / "dist"), stored_tensors(tmp_path / name / "B" / "dist")
        assert sorted(a) == sorted(b) and any(k.startswith("optimizer.state.exp_avg_sq.") for k in a)
        for key, tensor in a.items():
            assert same_but_padding(b[key], tensor), f"{name}: {key}"
        saved = run["saved"]
        for layout in ("dp2", "pp2"):
            got = run[layout]
            assert got["step"] == 1, name
            assert sorted(got["loaded"]) == sorted(saved)
            for key, tensor in saved.items():
                assert torch.equal(got["loaded"][key], tensor), f"{name} {layout}: {key}"
            rel = 1e-4 if dtype == "float32" else 3e-2
            for key in ("loss", "pg_loss", "grad_norm"):
                assert got["m2"][key] == pytest.approx(run["m2"][key], rel=rel, abs=1e-6), (
                    f"{name} {layout} {key}"
                )
            after, resumed = run["after2"], got["after2"]
            worst = max(float((resumed[k].float() - t.float()).abs().max()) for k, t in after.items())
            moved = max(float((after[k].float() - t.float()).abs().max()) for k, t in saved.items())
            # How far the resumed update is from the uninterrupted one, relative to the update itself.
            off = sum(float((resumed[k].float() - t.float()).abs().sum()) for k, t in after.items())
            update = sum(float((after[k].float() - t.float()).abs().sum()) for k, t in saved.items())
            print(
                f"{name} {layout}: resumed step: max abs diff {worst:.3g}, relative {off / update:.3g} (moved {moved:.3g})"
            )
            assert moved > LR / 2
            if dtype == "float32":
                assert worst < 1e-5, f"{name} {layout}: {worst}"
            else:
                # bf16: gradients differ between layouts by bf16 noise, so the fp32 main params differ
                # slightly and some weights round the other way (one bf16 step, a few in a hundred
                # elements); a resume with lost moments would be off by about the whole update.
                assert off / update < 0.1, f"{name} {layout}: {off / update:.3g}"
        failed = [torch.load(tmp_path / f"gpu.{r}", weights_only=False)[name]["failed"] for r in (0, 1)]
        assert all(f is not None and f[1] for f in failed), failed


def same_but_padding(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal, or equal in the rows both have along the vocab dimension with zeros beyond (padding)."""
    if got.shape == want.shape:
        return torch.equal(got, want)
    dim = next(i for i, (g, w) in enumerate(zip(got.shape, want.shape, strict=True)) if g != w)
    rows = min(got.shape[dim], want.shape[dim])
    longer = got if got.shape[dim] > rows else want
    return (
        torch.equal(got.narrow(dim, 0, rows), want.narrow(dim, 0, rows))
        and not longer.narrow(dim, rows, longer.shape[dim] - rows).any()
    )
