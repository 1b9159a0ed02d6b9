"""The plain-torch fusions of ``trainer/megatron/fusions.py`` on CPU: the wgrad stand-in's arithmetic
and Megatron DDP's main grads with it (tied and untied embeddings, two micro-batches), the compiled
RMSNorm and RoPE against torch's / megatron-core's eager code, a model built with every fusion
against one without (state-dict names, logits, main grads), fused Adam, and the MFU benchmark's
options. Skipped where megatron-core is not installed (CI).

Compiles are slow on small CPUs: the tests share few shapes (hidden 64, head_dim 16, fp32 unless
a test is about bf16), so dynamo compiles each graph once for the whole module; recompile-limit hits
fail instead of falling back to eager quietly.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

pytest.importorskip("megatron.core")

from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.optimizer.optimizer import ChainedOptimizer
from megatron.core.tensor_parallel import layers as tp_layers
from megatron.core.transformer.transformer_config import TransformerConfig

from rljob_runtime.trainer.megatron import ModelShape, model_shape, validate_parallelism
from rljob_runtime.trainer.megatron import fusions as fz
from rljob_runtime.trainer.megatron.model import (
    build_gpt_model,
    forward_logits,
    init_model_parallel,
    load_hf_weights,
)
from rljob_runtime.trainer.megatron.testing import LLAMA_UNTIED, QWEN3_0_6B, random_hf_state

HIDDEN, HEAD_DIM, EPS = 64, 16, 1e-6
# Qwen3-style (tied embeddings, qk-norm, GQA 4:2) and Llama-style (untied, no qk-norm).
TIED = {
    **QWEN3_0_6B,
    "hidden_size": HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": HEAD_DIM,
    "vocab_size": 90,
}
UNTIED = {**LLAMA_UNTIED, "hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 2}
UNTIED.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=90)


@pytest.fixture(autouse=True)
def _no_quiet_eager_fallback() -> Iterator[None]:
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


@pytest.fixture(autouse=True)
def _fusions_uninstalled() -> Iterator[None]:
    yield
    fz.uninstall_rope_fusion()
    fz.uninstall_wgrad_fusion()


def test_fusion_names_are_checked() -> None:
    assert fz.check_fusions(["norm", "rope"]) == {"norm", "rope"}
    with pytest.raises(ValueError, match="unknown fusion"):
        fz.check_fusions(["norm", "layernorm"])


# ----------------------------------------------------------------------- gradient accumulation


@pytest.mark.parametrize(
    ("grad_dtype", "dtype"),
    [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16)],
)
def test_wgrad_stand_in_accumulates_grad_output_t_times_input(
    grad_dtype: torch.dtype, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 24, generator=gen).to(dtype)  # [tokens, in]
    g = torch.randn(37, 40, generator=gen).to(dtype)  # [tokens, out]
    main_grad = torch.randn(40, 24, generator=gen).to(grad_dtype)
    expected = main_grad.double() + g.double().t() @ x.double()
    before = main_grad.clone()
    kernel = fz.WGRAD.wgrad_gemm_accum_fp32 if grad_dtype == torch.float32 else fz.WGRAD.wgrad_gemm_accum_fp16
    ptr = main_grad.data_ptr()
    kernel(x, g, main_grad)
    assert main_grad.data_ptr() == ptr and main_grad.dtype == grad_dtype  # in place
    tol = 1e-5 if dtype == grad_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(main_grad.double(), expected, rtol=tol, atol=tol)
    if (grad_dtype, dtype) == (torch.float32, torch.bfloat16):
        # CPU: the product in bf16, then added: exactly the unfused path (bf16 .grad + DDP's add_).
        assert torch.equal(main_grad, before + (g.t() @ x).float())


def test_wgrad_install_is_idempotent_and_lets_the_config_build(cpu_megatron: None) -> None:
    if tp_layers._grad_accum_fusion_available:
        pytest.skip("apex's fused_weight_gradient_mlp_cuda is installed (kept by install_wgrad_fusion)")
    config = TransformerConfig(
        num_layers=1, hidden_size=8, num_attention_heads=2, gradient_accumulation_fusion=True
    )
    with pytest.raises(RuntimeError, match="fused_weight_gradient_mlp_cuda"):
        tp_layers.ColumnParallelLinear(8, 8, config=config, init_method=torch.nn.init.zeros_)
    fz.install_wgrad_fusion()
    fz.install_wgrad_fusion()
    assert tp_layers.fused_weight_gradient_mlp_cuda is fz.WGRAD and tp_layers._grad_accum_fusion_available
    tp_layers.ColumnParallelLinear(8, 8, config=config, init_method=torch.nn.init.zeros_)
    fz.uninstall_wgrad_fusion()
    assert not tp_layers._grad_accum_fusion_available
    assert not hasattr(tp_layers, "fused_weight_gradient_mlp_cuda")


def _ddp_model(
    config: dict[str, Any], dtype: torch.dtype, fusions: tuple[str, ...]
) -> tuple[DistributedDataParallel, ModelShape]:
    shape = model_shape(config)
    par = validate_parallelism(shape, gpus=1)
    init_model_parallel(par)
    model = build_gpt_model(shape, par, dtype=dtype, fusions=fusions)
    load_hf_weights(model, random_hf_state(shape, seed=11), shape, par)
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False)
    return DistributedDataParallel(config=model.config, ddp_config=ddp, module=model), shape


def _two_micro_batches(ddp: DistributedDataParallel, shape: ModelShape) -> list[torch.Tensor]:
    """Forward + backward of two micro-batches (different lengths) into the grad buffer."""
    ddp.zero_grad_buffer()
    gen = torch.Generator().manual_seed(5)
    logits = []
    for length in (9, 6):
        out = forward_logits(ddp, torch.randint(0, shape.vocab_size, (2, length), generator=gen), shape)
        out.float().logsumexp(-1).mean().backward()
        logits.append(out.detach())
    return logits


def _main_grads(ddp: DistributedDataParallel) -> dict[str, torch.Tensor]:
    grads = {}
    for name, param in ddp.module.named_parameters():
        assert param.grad is None  # DDP's hook moved every grad into main_grad
        grads[name] = param.main_grad.detach().clone()
    return grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config", [TIED, UNTIED], ids=["tied", "untied"])
def test_wgrad_main_grads_match_unfused_under_ddp(
    cpu_megatron: None, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], dtype: torch.dtype
) -> None:
    reference, shape = _ddp_model(config, dtype, ())
    _two_micro_batches(reference, shape)
    expected = _main_grads(reference)

    calls = []
    accumulate = fz.WGRAD.wgrad_gemm_accum_fp32
    monkeypatch.setattr(fz.WGRAD, "wgrad_gemm_accum_fp32", lambda *a: calls.append(1) or accumulate(*a))
    fused, _ = _ddp_model(config, dtype, ("wgrad",))
    _two_micro_batches(fused, shape)
    got = _main_grads(fused)
    # 4 linears per layer and the output layer (tied: the embedding weight), twice.
    assert len(calls) == 2 * (4 * shape.num_layers + 1)
    inner = fused.module
    assert inner.decoder.layers[0].mlp.linear_fc1.weight.grad_added_to_main_grad
    tied = inner.shared_embedding_or_output_weight() if shape.tied_embeddings else None
    assert tied is None or tied.zero_out_wgrad  # the lookup's .grad is still added by DDP's hook
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        if dtype == torch.float32:
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)
        elif tied is None:  # CPU bf16: the same bf16 products added in the same order
            assert torch.equal(got[name], grad), name
        else:  # tied: the output grad is no longer summed with the lookup's in bf16 first
            torch.testing.assert_close(got[name], grad, rtol=2e-2, atol=1e-4, msg=name)


# -------------------------------------------------------------------------------------- RMSNorm


def _norm_config() -> TransformerConfig:
    return TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, normalization="RMSNorm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_rms_norm_matches_torch(dtype: torch.dtype) -> None:
    ours = fz.FusedRMSNorm(_norm_config(), HIDDEN, eps=EPS)
    theirs = torch.nn.RMSNorm(HIDDEN, eps=EPS)  # what WrappedTorchNorm builds: fp32 weight
    assert ours.weight.dtype == theirs.weight.dtype and ours.weight.shape == theirs.weight.shape
    assert ours.weight.sequence_parallel is False
    with torch.no_grad():
        weight = 1 + 0.1 * torch.randn(HIDDEN, generator=torch.Generator().manual_seed(1))
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    gen = torch.Generator().manual_seed(2)
    x = (3 * torch.randn(11, 2, HIDDEN, generator=gen)).to(dtype)
    grad = torch.randn(11, 2, HIDDEN, generator=gen).to(dtype)
    outs = []
    for norm in (ours, theirs):
        xi = x.clone().requires_grad_()
        y = norm(xi)
        y.backward(grad)
        outs.append((y, xi.grad, norm.weight.grad))
    (y, dx, dw), (ref_y, ref_dx, ref_dw) = outs
    assert y.dtype == dtype and y.shape == x.shape
    if dtype == torch.float32:
        for a, b in zip((y, dx, dw), (ref_y, ref_dx, ref_dw), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:  # one rounding to bf16 instead of torch's two: within a bf16 ulp or so
        torch.testing.assert_close(y, ref_y)
        torch.testing.assert_close(dx, ref_dx)
        torch.testing.assert_close(dw, ref_dw, rtol=2e-2, atol=2e-2)


def test_fused_rms_norm_refuses_what_torch_norm_refuses() -> None:
    config = _norm_config()
    config.layernorm_zero_centered_gamma = True
    with pytest.raises(NotImplementedError, match="zero-centred"):
        fz.FusedRMSNorm(config, HIDDEN)
    with pytest.raises(NotImplementedError, match="normalization"):
        fz.FusedRMSNorm(TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2), 8)


# ----------------------------------------------------------------------------------------- RoPE


def _qk(dtype: torch.dtype, seq: int = 10, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """q [s, b, 4, d] and k [s, b, 2, d] as Megatron makes them: strided slices of one qkv tensor."""
    qkv = torch.randn(seq, batch, 2, 4 * HEAD_DIM, generator=torch.Generator().manual_seed(3)).to(dtype)
    q, k, _ = torch.split(qkv, [2 * HEAD_DIM, HEAD_DIM, HEAD_DIM], dim=-1)
    return q.reshape(seq, batch, 4, HEAD_DIM), k


def _freqs(seq: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]  # [s, 1, 1, d], as RotaryEmbedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_rope_matches_megatron(dtype: torch.dtype) -> None:
    graphs: list[int] = []
    for seq, batch in ((10, 2), (7, 1)):  # a new length and batch size: no recompile (dims dynamic)
        graphs.append(counters["stats"]["unique_graphs"])
        freqs = _freqs(seq)
        for t in _qk(dtype, seq, batch):
            outs = []
            for fn in (fz.fused_rope_bshd, fz._ROPE_BSHD):
                ti = t.detach().requires_grad_()
                y = fn(ti, freqs, mscale=1.0)
                y.backward(torch.ones_like(y) * torch.linspace(-1, 1, y.shape[-1], dtype=dtype))
                outs.append((y, ti.grad))
            (y, dt), (ref_y, ref_dt) = outs
            assert y.shape == t.shape and y.dtype == dtype
            if dtype == torch.float32:
                torch.testing.assert_close(y, ref_y, rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(dt, ref_dt, rtol=1e-6, atol=1e-6)
            else:  # eager rounds to bf16 after each op, the kernel once
                torch.testing.assert_close(y, ref_y, rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(dt, ref_dt, rtol=2e-2, atol=2e-2)
    assert counters["stats"]["unique_graphs"] == graphs[-1]


def test_compiled_rope_refuses_what_it_does_not_do() -> None:
    q, _ = _qk(torch.float32)
    with pytest.raises(NotImplementedError, match="interleaved"):
        fz.fused_rope_bshd(q, _freqs(10), rotary_interleaved=True)
    with pytest.raises(NotImplementedError, match="freqs"):  # mRoPE-style per-row frequencies
        fz.fused_rope_bshd(q, _freqs(10).expand(10, 2, 1, HEAD_DIM))


def test_rope_install_routes_megatron_apply_and_uninstalls(
    cpu_megatron: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = rope_utils._apply_rotary_pos_emb_bshd
    fz.install_rope_fusion()
    fz.install_rope_fusion()
    assert fz.rope_fusion_installed() and rope_utils._apply_rotary_pos_emb_bshd is fz.fused_rope_bshd
    calls = []
    monkeypatch.setattr(fz, "_compiled_rope", lambda: lambda *a, **k: calls.append(1) or original(*a, **k))
    config = SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False)
    q, _ = _qk(torch.float32)
    # cp_group given: without it megatron asks parallel_state, which only an earlier model build in
    # this worker would have set up (xdist may run this test first).
    rope_utils.apply_rotary_pos_emb(q, _freqs(10), config=config, cp_group=dist.group.WORLD)  # type: ignore[arg-type]
    assert calls == [1]
    fz.uninstall_rope_fusion()
    assert not fz.rope_fusion_installed() and rope_utils._apply_rotary_pos_emb_bshd is original


# -------------------------------------------------------------------------- the whole model


def test_model_with_every_fusion_matches_the_unfused_one(cpu_megatron: None) -> None:
    reference, shape = _ddp_model(TIED, torch.float32, ())
    ref_logits = _two_micro_batches(reference, shape)
    expected = _main_grads(reference)
    fused, _ = _ddp_model(TIED, torch.float32, ("wgrad", "norm", "rope"))
    assert fz.rope_fusion_installed()
    logits = _two_micro_batches(fused, shape)
    got = _main_grads(fused)

    norms = [m for m in fused.module.modules() if isinstance(m, fz.FusedRMSNorm)]
    assert len(norms) == 4 * shape.num_layers + 1  # input, pre-MLP, q, k per layer; final
    assert not any(isinstance(m, torch.nn.RMSNorm) for m in fused.module.modules())
    ref_state, state = reference.module.state_dict(), fused.module.state_dict()
    assert list(state) == list(ref_state)
    for key, value in ref_state.items():  # tensors (megatron's linears add an ``_extra_state`` None)
        if isinstance(value, torch.Tensor):
            assert (state[key].dtype, state[key].shape) == (value.dtype, value.shape), key
    for a, b in zip(logits, ref_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    ids = torch.randint(0, shape.vocab_size, (3, 5), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():  # log-probs and the reference model: the graphs without autograd
        torch.testing.assert_close(
            forward_logits(fused, ids, shape), forward_logits(reference, ids, shape), rtol=1e-5, atol=1e-5
        )


# ---------------------------------------------------------------------------------- fused Adam


def _adam_twins() -> tuple[list[torch.optim.Optimizer], list[list[torch.nn.Parameter]]]:
    gen = torch.Generator().manual_seed(4)
    init = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen), torch.randn(2, 2, generator=gen)]
    opts, params = [], []
    for _ in range(2):
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        groups = [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]
        opts.append(torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8))
        params.append(ps)
    return opts, params


def test_fused_adam_steps_like_the_unfused_one() -> None:
    (plain, fused), (plain_params, fused_params) = _adam_twins()
    # As get_megatron_optimizer nests them: a ChainedOptimizer of Megatron optimizers (one per
    # param-group kind), each holding its torch optimizer in .optimizer (None without parameters).
    chained = ChainedOptimizer([SimpleNamespace(optimizer=fused), SimpleNamespace(optimizer=None)])
    assert fz.use_fused_adam(chained) == [fused]
    assert all(g["fused"] and g["foreach"] is False for g in fused.param_groups)
    gen = torch.Generator().manual_seed(6)
    for _ in range(3):
        for a, b in zip(plain_params, fused_params, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        plain.step()
        fused.step()
    for a, b in zip(plain_params, fused_params, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    step = fused.state[fused_params[0]]["step"]
    assert step.dtype == torch.float32 and float(step) == 3.0
    with pytest.raises(RuntimeError, match="state already"):
        fz.use_fused_adam(fused)


def test_fused_adam_refuses_other_optimizers() -> None:
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(TypeError, match="SGD"):
        fz.use_fused_adam(SimpleNamespace(optimizer=sgd))


# ------------------------------------------------------------------- the MFU benchmark's options

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def bench() -> Any:
    if str(BENCH) not in sys.path:  # its sibling profile_summary.py
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("megatron_mfu_fusions", BENCH / "megatron_mfu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_fusion_options(bench: Any) -> None:
    default = bench.parse_args([])
    assert default.fusions == () and default.fused_adam
    from mfu_spec import model_fusions  # the spec it builds from (BENCH is on sys.path: the fixture)

    assert model_fusions(default.swiglu, default.fusions) == {"swiglu"}
    args = bench.parse_args(["--fusions", "rope, wgrad,norm", "--no-fused-adam", "--swiglu", "unfused"])
    assert args.fusions == ("norm", "rope", "wgrad") and not args.fused_adam
    assert set(fz.FUSIONS) == {"swiglu", *bench.EXTRA_FUSIONS}
    for parsed in (default, args):
        child = bench.parse_args([*bench.child_argv(parsed), "--models", "1b"])
        assert (child.fusions, child.fused_adam) == (parsed.fusions, parsed.fused_adam)
    with pytest.raises(SystemExit):
        bench.parse_args(["--fusions", "swiglu"])  # --swiglu's
    row = {"fusions": ["norm", "swiglu", "wgrad"], "fused_adam": True}
    assert bench.fusions_text(row) == "norm+wgrad / fused"
    assert bench.fusions_text({}) == "- / ?"  # results recorded before these fields
