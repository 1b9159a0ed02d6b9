"""The final table of ``megatron_mfu.py`` (pure: no torch, no megatron-core): one row per model's
result dict, then a line per profiled model."""

from __future__ import annotations

from typing import Any

from profile_summary import category_line


def fusions_text(result: dict[str, Any]) -> str:
    """The table's "fusions / Adam" cell: the fusions besides SwiGLU, and the Adam kernel ("?" for
    results recorded before these fields)."""
    extra = [f for f in result.get("fusions", []) if f != "swiglu"]
    adam = {True: "fused", False: "foreach"}.get(result.get("fused_adam"), "?")
    return f"{'+'.join(extra) or '-'} / {adam}"


def grads_text(result: dict[str, Any]) -> str:
    """The table's "grads" cell: the grad buffer's dtype, the optimizer offload, the TP layout."""
    text = result.get("grad_dtype", "fp32")
    if result.get("offload_optimizer"):
        text += " + offloaded optimizer"
    if result.get("tp", 1) > 1:
        text += f", TP{result['tp']} on {result.get('gpus', result['tp'])} GPUs"
    return text


def limit_text(result: dict[str, Any]) -> str:
    limit = result.get("memory_limit_gib")
    return "-" if limit is None else f"{limit:g} GiB"


def table_lines(results: list[dict[str, Any]]) -> list[str]:
    """The final table, then one line per profiled model."""
    lines = [
        "| model | params | seq x [sequences x] micro-batches | attention (kernel) | recompute "
        "| fusions / Adam | SwiGLU / CE fusion "
        "| grads | memory cap | step s (fwd+bwd / optimizer) | tokens/s | model TFLOP/s | MFU "
        "| peak mem GiB (host RSS) | MFU of each run | host CPU |"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['error']} |")
            continue
        ce = "chunked head" if r.get("lm_head") == "chunked" else "native" if r.get("ce_fusion") else "off"
        batch = r.get("micro_batch_size", 1)
        tokens = (
            f"{r['seq']} x {r['micro_batches']}"
            if batch == 1
            else f"{r['seq']} x {batch} x {r['micro_batches']}"
        )
        recompute = r["recompute"]
        if r.get("recompute_layers"):
            recompute = f"{recompute} ({r['recompute_layers']} layers)"
        lines.append(
            f"| {r['model']} | {r['params'] / 1e9:.2f}B | {tokens} | "
            f"{r['attention']} ({r['sdpa_backend']}) | {recompute} | {fusions_text(r)} | "
            f"{r['swiglu']} / {ce} | "
            f"{grads_text(r)} | "
            f"{limit_text(r)} | {r['step_s']} "
            f"({r['fwd_bwd_s']} / {r['optimizer_s']}) | {r['tokens_per_s']} | {r['model_tflops']} | "
            f"{r['mfu']:.3f} | {r['peak_mem_gib']} ({r.get('peak_host_rss_gib', '?')}) | "
            f"{' '.join(f'{m:.3f}' for m in r.get('mfu_runs', []))} | {r.get('host', {}).get('cpu', '?')} |"
        )
    for r in results:
        prof = r.get("profile")
        if not isinstance(prof, dict):
            continue
        if "error" in prof:
            lines.append(f"{r['model']} profile failed: {prof['error']}")
        else:
            lines.append(f"{r['model']} GPU time by category: {category_line(prof)}")
    return lines
