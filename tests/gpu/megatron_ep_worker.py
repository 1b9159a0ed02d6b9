"""torchrun worker of tests/gpu/test_megatron_ep_gpu.py: the megatron trainer rank on a random Qwen3-MoE
at expert parallel size 1 and 2 (data parallel 2 either way; megatron-core's alltoall dispatcher on
GPUs), each layout one GRPO step (log-probs, then the optimizer step), timed; results after each.

    torchrun --nproc-per-node 2 tests/gpu/megatron_ep_worker.py MODEL_DIR OUT.pt ep1,ep2 STEPS

Admission refuses training.parallelism.expert above 1 until this test has passed on GPUs: the worker
lifts that one limit in its own processes (as tests/unit/test_megatron_moe_rank.py does on CPU).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "runtime"), str(REPO / "api"), str(Path(__file__).parent)]

from megatron_backend_case import ADV, make_samples, make_spec  # noqa: E402

from rljob_api import support  # noqa: E402
from rljob_runtime.trainer.base import build_batch, rank_rows  # noqa: E402
from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank  # noqa: E402


def accept_expert_parallel() -> None:
    support.LIMITS = tuple(lim for lim in support.LIMITS if lim.field != ".training.parallelism.expert")


def run_layout(model_dir: str, ep: int, steps: int) -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    spec = make_spec(model_dir, dtype="bfloat16")
    par = spec.training.parallelism.model_copy(update={"expert": ep})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"parallelism": par})})
    trainer = MegatronTrainerRank(spec, model_dir, rank=dist.get_rank(), world_size=dist.get_world_size())
    trainer.init_process_group("unused", 0)  # the group torchrun started is reused
    samples = make_samples()
    full = build_batch(samples)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = rank_rows(len(samples), spec.training.global_batch_size, dp, dp_rank)
    batch = full.select(rows)
    adv = (ADV[:, None] * full.loss_mask)[rows]
    first: dict[str, Any] = {}
    times = []
    for step in range(steps):  # the first step compiles: the later ones are the timed ones
        torch.cuda.synchronize()
        began = time.perf_counter()
        before = trainer.logprobs(batch)
        metrics = trainer.train(batch, adv, before.logp, before.ref_logp)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
        if step == 0:
            first = {"metrics": metrics, "logp": before.logp}
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (rows, first["logp"]))
    logp = torch.zeros(full.size, max(t.shape[1] for _, t in parts))
    for r, t in parts:
        logp[r, : t.shape[1]] = t
    named = trainer.named_tensors()  # the HF export: both EP ranks gather the experts
    dispatcher = trainer.model.config.moe_token_dispatcher_type
    ps.destroy_model_parallel()
    return {
        "ep": ep,
        "dispatcher": dispatcher,
        "metrics": first["metrics"],
        "logp": logp,
        "step_s": times,
        "tokens": int(sum(full.sequence_lengths())),
        "padded_tokens": int(full.input_ids.numel()),
        "named": {k: v.float().cpu() for k, v in named.items()} if dist.get_rank() == 0 else {},
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def main() -> int:
    model_dir, out, layouts, steps = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
    accept_expert_parallel()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    results = []
    for layout in layouts:
        results.append(run_layout(model_dir, int(layout[2:]), steps))
        if dist.get_rank() == 0:  # after each layout: a later crash keeps the earlier results
            torch.save(results, out)
            row = {k: results[-1][k] for k in ("ep", "dispatcher", "metrics", "step_s", "peak_gib")}
            print("megatron-ep", row, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
