"""GPU kernel breakdown of one profiled training step, for ``megatron_mfu.py --profile``.

Pure helpers (no torch import; unit-tested on CPU by tests/unit/test_megatron_mfu_profile.py):

- ``kernel_category``: a kernel name -> a coarse category (gemm, attention, ...), by substrings.
- ``kernel_records``: the device-side kernels, memcpys and memsets out of ``torch.profiler``'s
  events (``prof.events()``), duck-typed: GPU user annotations (record_function ranges,
  torch.compile regions, which CUPTI mirrors onto the GPU timeline and which would count their
  kernels twice) and CUDA synchronisation records are left out.
- ``summarize_kernels``: the top kernels by total GPU time, totals per category, and how idle
  the GPU was over the step (CPU launch overhead, host-side work such as a CPU optimizer).
- ``format_summary`` / ``category_line``: printable tables and a one-line digest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

CATEGORIES = (
    "gemm",
    "attention",
    "elementwise/norm/rope",
    "reduce/softmax/cross-entropy",
    "embedding/index",
    "optimizer",
    "copy/cast",
    "nccl",
    "other",
)

# Inductor's generated kernels say what they are: pointwise, reduction, persistent reduction, template
# (matmul). torch.compile'd SwiGLU is "triton_poi_fused_mul_silu_0"; a name such as
# "triton_poi_fused__to_copy_..." must not fall into copy/cast.
_TRITON = re.compile(r"triton_(poi|red|per|tem)_")
_TRITON_CATEGORY = {
    "poi": "elementwise/norm/rope",
    "red": "reduce/softmax/cross-entropy",
    "per": "reduce/softmax/cross-entropy",
    "tem": "gemm",
}

# First match wins (regular expressions searched in the lower-cased name), so the order matters:
# "multi_tensor_apply_kernel<..LpNormFunctor..>" is the optimizer's grad norm, not a norm layer;
# "fmha_cutlassF_..." (SDPA's memory-efficient kernel) is attention, not a cutlass GEMM;
# "reduce_kernel<.. NormTwoOps ..>" is a reduction; "..direct_copy_kernel.." inside an
# elementwise_kernel is a copy.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (category, re.compile("|".join(patterns)))
    for category, patterns in (
        # torch's fused / foreach Adam and Megatron's grad norm and clipping (its multi_tensor_*
        # fallbacks without apex run on torch._foreach_*).
        ("optimizer", ("multi_tensor", "adam", "foreach", "lpnorm")),
        # flash (pytorch_flash::flash_fwd_kernel), cuDNN SDPA (cudnn_generated_fort_native_sdpa_..),
        # memory-efficient (fmha_cutlassF/B), anything attention-named.
        ("attention", ("flash", "fmha", "sdpa", "attention", "attn", "cudnn")),
        # cuBLAS(Lt) / CUTLASS: nvjet_*, sm90_xmma_gemm_*, ampere_bf16_s16816gemm_*, cutlass::Kernel2,
        # cublasLt::splitKreduce_kernel, gemv2T_kernel.
        ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "gemv", "matmul")),
        # Memcpy HtoD/DtoH/DtoD, Memset, .to() / .float() (direct_copy_kernel), torch.cat
        # (CatArrayBatchedCopy), zero_() / fill_() (FillFunctor); "cast" but not "broadcast", nor
        # ATen's template arguments "gpu_kernel_impl_nocast" and "LoadWithCast" / "StoreWithCast"
        # (any elementwise op, e.g. the fp32 main_grad += bf16 grad: an H100 profile filed them here).
        ("copy/cast", ("memcpy", "memset", "copy", "(?<!broad)(?<!no)(?<!with)cast", "fillfunctor")),
        # Embedding lookup (indexSelectLargeIndex) and its backward (sort + segment sums), advanced
        # indexing (the cross-entropy's logits[arange, target]) and index_put in backward.
        (
            "embedding/index",
            (
                "embedding",
                "index_",
                "indexselect",
                "indexing",
                "gather",
                "scatter",
                "segment",
                "radixsort",
                "compute_grad_weight",
            ),
        ),
        ("reduce/softmax/cross-entropy", ("reduce", "softmax", "cross_entropy", "nll_loss", "logsumexp")),
        # ATen pointwise kernels (vectorized_/unrolled_/elementwise_kernel: SiLU, mul, add, RoPE's
        # neg/mul/add, RMSNorm's pow/rsqrt/mul) and fused norm kernels (forward, GammaBeta backward).
        (
            "elementwise/norm/rope",
            ("elementwise", "norm", "gammabeta", "rope", "rotary", "silu", "swiglu", "act_and_mul"),
        ),
    )
)

# Device-side records that are not work: CUDA synchronisation (CUPTI's cuda_sync activity).
_NOT_WORK = frozenset({"Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event"})


def kernel_category(name: str) -> str:
    """The category of one GPU kernel (or memcpy / memset) name; "other" when nothing matches."""
    lowered = name.lower()
    if "nccl" in lowered:  # before everything: ncclDevKernel_AllGather_..., ..._Broadcast_...
        return "nccl"
    triton = _TRITON.search(lowered)
    if triton:
        return _TRITON_CATEGORY[triton.group(1)]
    for category, pattern in _RULES:
        if pattern.search(lowered):
            return category
    return "other"


@dataclass(frozen=True)
class KernelRecord:
    """One kernel (or memcpy / memset) execution on the GPU timeline, times in microseconds."""

    name: str
    start_us: float
    end_us: float

    @property
    def duration_us(self) -> float:
        return max(0.0, self.end_us - self.start_us)


def _device_name(device_type: Any) -> str:
    # torch's DeviceType enum (name "CUDA", str "DeviceType.CUDA"), or a plain string in tests.
    name = getattr(device_type, "name", None)
    return str(name if isinstance(name, str) else device_type).rsplit(".", 1)[-1]


def kernel_records(events: Iterable[Any]) -> list[KernelRecord]:
    """GPU work out of ``torch.profiler.profile(...).events()`` (``FunctionEvent``s): CUDA-device
    records that are neither user annotations nor synchronisation. Reads ``name``, ``device_type``,
    ``time_range.start`` / ``.end`` (us), and where present ``is_user_annotation`` and
    ``activity_type`` (torch >= 2.8 or so; e.g. "kernel", "gpu_memcpy", "gpu_user_annotation")."""
    records = []
    for event in events:
        if _device_name(event.device_type) != "CUDA":
            continue
        if getattr(event, "is_user_annotation", False):
            continue
        activity = str(getattr(event, "activity_type", None) or "").lower()
        if "annotation" in activity or "sync" in activity:
            continue
        if event.name in _NOT_WORK:
            continue
        records.append(
            KernelRecord(str(event.name), float(event.time_range.start), float(event.time_range.end))
        )
    return records


def busy_us(records: Iterable[KernelRecord]) -> float:
    """Time the GPU ran anything: the length of the union of the records' intervals (kernels on
    different streams that overlap count once)."""
    total = 0.0
    end = float("-inf")
    for start, stop in sorted((r.start_us, r.end_us) for r in records):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def truncate(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize_kernels(
    records: Sequence[KernelRecord],
    wall_ms: float,
    *,
    top: int = 25,
    name_width: int = 90,
    reference_step_ms: float | None = None,
) -> dict[str, Any]:
    """Breakdown of one step's GPU time.

    ``wall_ms``: the step's wall time as profiled (synchronised before and after). ``top``: how many
    kernels to list, by total GPU time (kernels grouped by full name, listed truncated to
    ``name_width``). Percentages are of ``kernel_ms``, the summed GPU time of all records.
    ``gpu_idle_fraction`` = 1 - busy / wall, busy being the union of the records' intervals (the
    same as 1 - kernel_ms / wall on one stream; no negative idle when streams overlap).
    ``reference_step_ms`` (the un-profiled mean step time) adds ``gpu_idle_fraction_unprofiled``:
    the profiler slows the host's launches, not the kernels, so this is the better estimate of the
    idle time of an ordinary step.
    """
    per_name: dict[str, list[float]] = {}
    per_category: dict[str, list[float]] = {}
    for record in records:
        for table, key in ((per_name, record.name), (per_category, kernel_category(record.name))):
            row = table.setdefault(key, [0, 0.0])
            row[0] += 1
            row[1] += record.duration_us
    kernel_us = sum(r.duration_us for r in records)
    busy = busy_us(records)

    def pct(us: float) -> float:
        return round(100.0 * us / kernel_us, 2) if kernel_us > 0 else 0.0

    def idle(step_ms: float | None) -> float | None:
        if not step_ms or step_ms <= 0:
            return None
        return round(min(1.0, max(0.0, 1.0 - busy / 1e3 / step_ms)), 4)

    ranked = sorted(per_name.items(), key=lambda kv: (-kv[1][1], kv[0]))
    summary: dict[str, Any] = {
        "wall_ms": round(wall_ms, 3),
        "kernel_ms": round(kernel_us / 1e3, 3),
        "busy_ms": round(busy / 1e3, 3),
        "kernel_launches": len(records),
        "distinct_kernels": len(per_name),
        "gpu_idle_fraction": idle(wall_ms),
        "top_kernels": [
            {
                "name": truncate(name, name_width),
                "calls": int(calls),
                "total_ms": round(us / 1e3, 3),
                "pct": pct(us),
                "category": kernel_category(name),
            }
            for name, (calls, us) in ranked[:top]
        ],
        "categories": [
            {"category": category, "calls": int(calls), "ms": round(us / 1e3, 3), "pct": pct(us)}
            for category, (calls, us) in sorted(per_category.items(), key=lambda kv: (-kv[1][1], kv[0]))
        ],
    }
    if reference_step_ms is not None:
        summary["reference_step_ms"] = round(reference_step_ms, 3)
        summary["gpu_idle_fraction_unprofiled"] = idle(reference_step_ms)
    return summary


def _fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def format_summary(summary: dict[str, Any]) -> list[str]:
    """Printable lines: totals, the top kernels, the categories."""
    lines = [
        f"profiled step: wall {summary['wall_ms']:.1f} ms, kernels {summary['kernel_ms']:.1f} ms "
        f"({summary['kernel_launches']} launches, {summary['distinct_kernels']} distinct), GPU busy "
        f"{summary['busy_ms']:.1f} ms, GPU idle {_fraction(summary['gpu_idle_fraction'])}"
    ]
    if "gpu_idle_fraction_unprofiled" in summary:
        lines.append(
            f"against the un-profiled step ({summary['reference_step_ms']:.1f} ms): GPU idle "
            f"{_fraction(summary['gpu_idle_fraction_unprofiled'])}"
        )
    lines += ["", "| kernel | category | calls | total ms | % GPU time |", "|---|---|---|---|---|"]
    for row in summary["top_kernels"]:
        name = row["name"].replace("|", "/")
        lines.append(
            f"| {name} | {row['category']} | {row['calls']} | {row['total_ms']:.3f} | {row['pct']:.2f} |"
        )
    lines += ["", "| category | calls | ms | % GPU time |", "|---|---|---|---|"]
    for row in summary["categories"]:
        lines.append(f"| {row['category']} | {row['calls']} | {row['ms']:.3f} | {row['pct']:.2f} |")
    return lines


def category_line(summary: dict[str, Any]) -> str:
    """One line: categories by share of GPU time, then GPU idle."""
    parts = [f"{row['category']} {row['pct']:.1f}%" for row in summary["categories"]]
    idle = summary.get("gpu_idle_fraction_unprofiled", summary["gpu_idle_fraction"])
    return ", ".join(parts) + f"; GPU idle {_fraction(idle)}"
