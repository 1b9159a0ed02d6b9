"""The CPU-testable parts of ``benchmarks/gpu/megatron_mfu.py`` (the GPU runs are the owner's): the
``--profile`` helpers of ``benchmarks/gpu/profile_summary.py`` (kernel categories, the kernels out of
profiler events, the per-kernel / per-category aggregation, GPU idle time) on hand-made kernel
names and events, and the script's arguments, their forwarding to the per-model processes and the
final table. Neither needs megatron-core nor a GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

GPU_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, GPU_BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


ps = _load("profile_summary")
bench = _load("megatron_mfu")


# Names as CUPTI reports them on H100 / H200 (cuBLAS, cuDNN / flash SDPA, ATen, Inductor, NCCL).
@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128", "attention"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<>)", "attention"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
            "elementwise/norm/rope",
        ),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
            "elementwise/norm/rope",
        ),
        ("triton_poi_fused_mul_silu_0", "elementwise/norm/rope"),
        ("triton_poi_fused__to_copy_mul_silu_1", "elementwise/norm/rope"),
        ("triton_red_fused__log_softmax_0", "reduce/softmax/cross-entropy"),
        ("triton_per_fused_sum_2", "reduce/softmax/cross-entropy"),
        ("triton_tem_fused_mm_0", "gemm"),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps<float>>>",
            "reduce/softmax/cross-entropy",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float>>>",
            "reduce/softmax/cross-entropy",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false>",
            "reduce/softmax/cross-entropy",
        ),
        (
            "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<>>",
            "embedding/index",
        ),
        (
            "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long>",
            "embedding/index",
        ),
        ("void at::native::(anonymous namespace)::krn_partials_per_segment<long>", "embedding/index"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>",
            "optimizer",
        ),
        ("void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>", "optimizer"),
        (
            "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<2>, LpNormFunctor>",
            "optimizer",
        ),
        ("Memcpy DtoH (Device -> Pinned)", "copy/cast"),
        ("Memset (Device)", "copy/cast"),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
            "copy/cast",
        ),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<OpaqueType<2u>, unsigned int, 3, 128, 1>",
            "copy/cast",
        ),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "copy/cast"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("ncclDevKernel_Broadcast_RING_LL", "nccl"),
        ("some_custom_kernel_without_a_hint", "other"),
    ],
)
def test_kernel_category(name: str, category: str) -> None:
    assert ps.kernel_category(name) == category
    assert category in ps.CATEGORIES


def test_broadcast_is_not_a_cast() -> None:
    assert ps.kernel_category("my_broadcast_kernel") == "other"
    assert ps.kernel_category("cast_transpose_kernel") == "copy/cast"


def test_aten_template_arguments_are_not_casts() -> None:
    # seen on an H100: generic and mixed-dtype elementwise ops, not copies
    nocast = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>>"
    mixed = "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3>, TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1>>"
    assert ps.kernel_category(nocast) == "elementwise/norm/rope"
    assert ps.kernel_category(mixed) == "elementwise/norm/rope"
    bf16 = "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}>"
    assert ps.kernel_category(bf16) == "copy/cast"


def _event(name: str, start: float, end: float, device: Any = "CUDA", **extra: Any) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), **extra
    )


def test_kernel_records_keep_gpu_work_only() -> None:
    cuda = torch.autograd.DeviceType.CUDA  # the enum the profiler's FunctionEvent carries
    events = [
        _event("aten::mm", 0.0, 50.0, device=torch.autograd.DeviceType.CPU),  # a CPU op
        _event("nvjet_gemm", 10.0, 40.0, device=cuda, is_user_annotation=False, activity_type="kernel"),
        _event("Memset (Device)", 41.0, 42.0, activity_type="gpu_memset"),
        _event("## Call CompiledFxGraph ##", 5.0, 60.0, is_user_annotation=True),  # GPU annotation
        _event("ProfilerStep#1", 0.0, 70.0, activity_type="gpu_user_annotation"),
        _event("Context Sync", 60.0, 65.0, activity_type="cuda_sync"),
        _event("Stream Sync", 60.0, 61.0),  # older torch: no activity_type
        _event("flash_fwd", 43.0, 48.0, device="DeviceType.CUDA"),  # str() of the enum
    ]
    records = ps.kernel_records(events)
    assert [r.name for r in records] == ["nvjet_gemm", "Memset (Device)", "flash_fwd"]
    assert records[0] == ps.KernelRecord("nvjet_gemm", 10.0, 40.0)
    assert records[0].duration_us == 30.0


def test_kernel_records_read_real_profiler_events() -> None:
    # On CPU the trace has CPU ops only: no CUDA records, and the attribute access must hold.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    events = prof.events()
    assert any(e.name == "aten::mm" for e in events)
    assert ps.kernel_records(events) == []


def test_busy_time_is_the_union_of_intervals() -> None:
    k = ps.KernelRecord
    assert ps.busy_us([]) == 0.0
    assert ps.busy_us([k("a", 0, 10), k("b", 20, 25)]) == 15.0  # disjoint
    assert ps.busy_us([k("a", 0, 10), k("b", 5, 15)]) == 15.0  # overlapping streams
    assert ps.busy_us([k("a", 0, 30), k("b", 5, 10), k("c", 12, 20)]) == 30.0  # nested
    assert ps.busy_us([k("b", 20, 25), k("a", 0, 10), k("c", 10, 12)]) == 17.0  # unsorted, touching


def _records() -> list[Any]:
    k = ps.KernelRecord
    gemm = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT"
    return [
        k(gemm, 0, 400),  # 3 calls, 1000 us
        k(gemm, 500, 800),
        k(gemm, 900, 1200),
        k("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 1300, 1500),  # 200 us
        k("triton_poi_fused_mul_silu_0", 1600, 1700),  # 100 us
        k("triton_poi_fused_mul_silu_0", 1700, 1750),  # 50 us
        k("Memcpy DtoD (Device -> Device)", 1800, 1850),  # 50 us
        k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1750, 1850),  # 100 us, overlaps the memcpy
    ]


def test_summarize_kernels_totals_top_and_categories() -> None:
    summary = ps.summarize_kernels(_records(), wall_ms=2.5, top=3)
    assert summary["kernel_ms"] == 1.5  # 1000 + 200 + 150 + 50 + 100 us
    assert summary["busy_ms"] == 1.45  # the nccl / memcpy overlap counts once
    assert summary["kernel_launches"] == 8 and summary["distinct_kernels"] == 5
    assert summary["gpu_idle_fraction"] == pytest.approx(1 - 1.45 / 2.5, abs=1e-4)
    assert "gpu_idle_fraction_unprofiled" not in summary
    top = summary["top_kernels"]
    assert len(top) == 3
    assert [(t["calls"], t["total_ms"], t["category"]) for t in top] == [
        (3, 1.0, "gemm"),
        (1, 0.2, "attention"),
        (2, 0.15, "elementwise/norm/rope"),
    ]
    assert top[0]["pct"] == pytest.approx(100 * 1000 / 1500, abs=0.01)
    categories = {c["category"]: c for c in summary["categories"]}
    assert set(categories) == {"gemm", "attention", "elementwise/norm/rope", "copy/cast", "nccl"}
    assert categories["nccl"]["ms"] == 0.1 and categories["copy/cast"]["calls"] == 1
    assert [c["category"] for c in summary["categories"]][:2] == ["gemm", "attention"]  # by time
    assert sum(c["pct"] for c in summary["categories"]) == pytest.approx(100, abs=0.05)


def test_summarize_kernels_truncates_names_and_groups_by_full_name() -> None:
    long_a, long_b = "k" * 120 + "_a", "k" * 120 + "_b"
    records = [ps.KernelRecord(long_a, 0, 10), ps.KernelRecord(long_b, 10, 30)]
    summary = ps.summarize_kernels(records, wall_ms=0.03, name_width=90)
    names = [t["name"] for t in summary["top_kernels"]]
    assert len(names) == 2  # two kernels, even though their shown names are the same
    assert all(len(n) == 90 and n.endswith("...") for n in names)
    assert [t["total_ms"] for t in summary["top_kernels"]] == [0.02, 0.01]
    assert ps.truncate("short", 90) == "short"


def test_idle_fraction_against_the_unprofiled_step_and_edge_cases() -> None:
    summary = ps.summarize_kernels(_records(), wall_ms=2.9, reference_step_ms=1.6)
    assert summary["reference_step_ms"] == 1.6
    assert summary["gpu_idle_fraction_unprofiled"] == pytest.approx(1 - 1.45 / 1.6, abs=1e-4)
    # Never negative (a reference shorter than the busy time), None without a wall time.
    assert ps.summarize_kernels(_records(), wall_ms=1.0)["gpu_idle_fraction"] == 0.0
    empty = ps.summarize_kernels([], wall_ms=0.0)
    assert empty["gpu_idle_fraction"] is None and empty["kernel_ms"] == 0.0
    assert empty["top_kernels"] == [] and empty["categories"] == []


def test_format_summary_and_category_line() -> None:
    summary = ps.summarize_kernels(_records(), wall_ms=2.5, reference_step_ms=2.0)
    lines = ps.format_summary(summary)
    assert lines[0].startswith("profiled step: wall 2.5 ms, kernels 1.5 ms (8 launches, 5 distinct)")
    assert "GPU idle 42.0%" in lines[0]
    assert "GPU idle 27.5%" in lines[1]  # 1 - 1.45 / 2.0
    assert "| nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT | gemm | 3 | 1.000 | 66.67 |" in lines
    assert "| gemm | 3 | 1.000 | 66.67 |" in lines
    line = ps.category_line(summary)
    assert line.startswith("gemm 66.7%, attention 13.3%, ")
    assert line.endswith("; GPU idle 27.5%")  # the un-profiled estimate when there is one


# The benchmark script itself (imports no megatron-core until a model is run).


def test_script_imports_without_megatron() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(GPU_BENCH / 'megatron_mfu.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(any(k == 'megatron' or k.startswith('megatron.') for k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_arguments_defaults_and_new_options() -> None:
    args = bench.parse_args([])
    assert args.models == "1b,4b" and args.micro_batches == 4 and args.swiglu == "fused"
    assert not args.ce_fusion and args.grad_dtype == "fp32" and args.memory_limit_gib is None
    assert not args.profile
    assert args.micro_batch_size == 1 and args.recompute_layers is None and args.lm_head == "full"
    new = bench.parse_args(["--ce-fusion", "--grad-dtype", "bf16", "--memory-limit-gib", "78", "--profile"])
    assert new.ce_fusion and new.grad_dtype == "bf16" and new.memory_limit_gib == 78.0 and new.profile
    more = bench.parse_args(
        ["--lm-head", "chunked", "--recompute", "full", "--recompute-layers", "24", "--micro-batch-size", "2"]
    )
    assert more.lm_head == "chunked" and more.recompute_layers == 24 and more.micro_batch_size == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["--micro-batches", "0"],
        ["--memory-limit-gib", "0"],
        ["--grad-dtype", "fp16"],
        ["--micro-batch-size", "0"],
        ["--recompute-layers", "4"],  # needs --recompute full
        ["--recompute", "full", "--recompute-layers", "0"],
        ["--lm-head", "chunked", "--ce-fusion"],
        ["--lm-head", "fused"],
    ],
)
def test_arguments_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--ce-fusion", "--grad-dtype", "bf16", "--profile", "--recompute", "full"],
        ["--memory-limit-gib", "78", "--micro-batches", "8", "--swiglu", "unfused"],
        ["--attention", "local", "--sdpa-backend", "cudnn", "--seq", "2048"],
        [
            "--lm-head",
            "chunked",
            "--recompute",
            "full",
            "--recompute-layers",
            "20",
            "--micro-batch-size",
            "2",
        ],
        ["--runs", "3", "--offload-optimizer"],
    ],
)
def test_child_processes_get_every_option(argv: list[str]) -> None:
    args = bench.parse_args([*argv, "--models", "1b,4b", "--json", "/tmp/x.json"])
    child = bench.parse_args([*bench.child_argv(args), "--models", "4b", "--json", "/tmp/x.4b.json"])
    assert {**vars(child), "models": None, "json": None} == {**vars(args), "models": None, "json": None}


def _result(**extra: Any) -> dict[str, Any]:
    return {
        "model": "1b",
        "params": 1.12e9,
        "seq": 4096,
        "micro_batches": 4,
        "attention": "sdpa",
        "sdpa_backend": "cudnn_attention",
        "swiglu": "fused",
        "recompute": None,
        "ce_fusion": False,
        "grad_dtype": "fp32",
        "memory_limit_gib": None,
        "step_s": 0.46,
        "fwd_bwd_s": 0.424,
        "optimizer_s": 0.036,
        "tokens_per_s": 35612.0,
        "model_tflops": 296.0,
        "mfu": 0.299,
        "peak_mem_gib": 31.3,
        "peak_host_rss_gib": 6.0,
        **extra,
    }


def test_table_shows_the_new_fields_and_the_profile() -> None:
    summary = ps.summarize_kernels(_records(), wall_ms=2.5)
    results = [
        _result(),
        _result(model="1b-fused", ce_fusion=True, grad_dtype="bf16", profile=summary),
        _result(model="4b", memory_limit_gib=78.0, profile={"error": "X: y"}),
        {"model": "4b", "error": "out of memory: ..."},
        _result(model="4b", recompute="full", recompute_layers=24, lm_head="chunked", micro_batch_size=2),
    ]
    lines = bench.table_lines(results)
    assert "| SwiGLU / CE fusion | grads | memory cap |" in lines[0]
    assert "| 4096 x 2 x 4 | sdpa (cudnn_attention) | full (24 layers) |" in lines[5]
    assert "| fused / chunked head |" in lines[5]
    assert "| 4096 x 4 | sdpa (cudnn_attention) | None |" in lines[1]
    assert "| fused / off | fp32 | - | 0.46 (0.424 / 0.036) |" in lines[1]
    assert lines[1].endswith("| 0.299 | 31.3 (6.0) |  | ? |")
    assert "| fused / native | bf16 | - |" in lines[2]
    assert "| fused / off | fp32 | 78 GiB |" in lines[3]
    assert lines[4] == "| 4b | out of memory: ... |"
    assert lines[6] == f"1b-fused GPU time by category: {ps.category_line(summary)}"
    assert lines[7] == "4b profile failed: X: y"
    assert len(lines) == 8
    runs = bench.table_lines(
        [_result(offload_optimizer=True, mfu_runs=[0.41, 0.4, 0.43], host={"cpu": "Xeon 8480+"})]
    )
    assert "| fp32 + offloaded optimizer |" in runs[1]
    assert bench.grads_text({"grad_dtype": "fp32", "tp": 2, "gpus": 2}) == "fp32, TP2 on 2 GPUs"
    assert runs[1].endswith("| 0.299 | 31.3 (6.0) | 0.410 0.400 0.430 | Xeon 8480+ |")


def test_runs_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--runs", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--tp", "2", "--models", "1b,4b"])
    assert bench.parse_args([]).runs == 1 and not bench.parse_args([]).offload_optimizer


def test_limit_text() -> None:
    assert bench.limit_text({"memory_limit_gib": None}) == "-"
    assert bench.limit_text({"memory_limit_gib": 78.0}) == "78 GiB"
