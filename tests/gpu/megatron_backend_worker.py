"""torchrun worker of tests/gpu/test_megatron_backend.py: one first GRPO step of MegatronTrainerRank per
layout (e.g. tp1 = TP 1 x DP 2, tp2, pp2 on 2 GPUs), results written after each layout.

    torchrun --nproc-per-node 2 tests/gpu/megatron_backend_worker.py MODEL_DIR OUT.pt tp1,tp2,pp2
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "runtime"), str(REPO / "api"), str(Path(__file__).parent)]

from megatron_backend_case import ADV, make_samples, make_spec  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rljob_runtime.trainer.base import build_batch, rank_rows  # noqa: E402
from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank  # noqa: E402


def _gather_rows(local: torch.Tensor, rows: list[int], total: int, group: Any = None) -> torch.Tensor:
    """Every data-parallel rank's [rows, T] -> the whole batch's [total, T] (same on every rank)."""
    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, (rows, local), group=group)
    out = torch.zeros(total, max(t.shape[1] for _, t in parts))
    for r, t in parts:
        out[r, : t.shape[1]] = t
    return out


def run_layout(model_dir: str, layout: str) -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    tp = int(layout[2:]) if layout.startswith("tp") else 1
    pp = int(layout[2:]) if layout.startswith("pp") else 1
    spec = make_spec(model_dir, tp=tp, pp=pp, dtype="bfloat16")
    world, rank = dist.get_world_size(), dist.get_rank()
    trainer = MegatronTrainerRank(spec, model_dir, rank=rank, world_size=world)
    trainer.init_process_group("unused", 0)  # the group torchrun started is reused
    samples = make_samples()
    full = build_batch(samples)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = rank_rows(len(samples), spec.training.global_batch_size, dp, dp_rank)
    batch = full.select(rows)
    adv = (ADV[:, None] * full.loss_mask)[rows]
    before = trainer.logprobs(batch)
    metrics = trainer.train(batch, adv, before.logp, before.ref_logp)
    after = trainer.logprobs(batch)
    # whole HF weights on the replica's first rank (tp = pp = 0, so always global rank 0, whose
    # results are saved), {} on its other ranks
    named = trainer.named_tensors()
    initial = load_file(str(Path(model_dir) / "model.safetensors"))
    group = ps.get_data_parallel_group()
    result = {
        "layout": layout,
        "dp": dp,
        "metrics": metrics,
        "logp_before": _gather_rows(before.logp, rows, full.size, group),
        "ref_equals_policy": bool(torch.equal(before.logp, before.ref_logp)),
        "logp_after": _gather_rows(after.logp, rows, full.size, group),
        "holds_weights": bool(named),
        "num_tensors": len(initial),
    }
    if named:
        result["names_match"] = sorted(named) == sorted(initial)
        result["max_weight_change"] = max(
            float((named[k].float() - initial[k].float()).abs().max()) for k in initial
        )
        result["changed_tensors"] = sum(
            not torch.equal(named[k].float(), initial[k].to(named[k].dtype).float()) for k in initial
        )
    ps.destroy_model_parallel()
    return result


def main() -> int:
    model_dir, out, layouts = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    results = []
    for layout in layouts:
        results.append(run_layout(model_dir, layout))
        if dist.get_rank() == 0:  # after each layout: a later crash keeps the earlier results
            torch.save(results, out)
            print(layout, results[-1]["metrics"], flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
