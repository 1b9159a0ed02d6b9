"""training.routingReplay on one GPU: the random Qwen3-MoE of test_megatron_moe_gpu.py (4 layers,
16 experts, top 4), GRPO on megatron colocated with a stock SGLang engine, one step with the replay
off and one with it on (same seed, data and weights, so SGLang samples the same responses).

- with the replay on, SGLang returns a routing record with every sample (int32 [tokens - 1, 4 layers
  x top 4], experts 0..15) and the trainer gets it for every sample it trains on;
- the trainer's log-probs of the sampled tokens are no further from SGLang's with the replay than
  without (``train/rollout_logp_abs_diff``): records laid out wrong would route tokens to other
  experts and widen the gap by orders of magnitude, while right ones leave only the kernels' part.

Each run's row is printed as it ends and written to $RLJOB_RESULTS_DIR when set.

The requests go to the engine directly (the pinned sglang-router drops return_routed_experts:
tests/integration/test_router_request_fields.py).

Until this test has passed, admission and the runtime refuse routingReplay ("not yet shown on GPUs",
api/rljob_api/support.py): the test lifts that one limit in this process and, through Ray's
worker_process_setup_hook on the Ray it starts for both runs, in every Ray worker (the trainer ranks
check the support matrix too). Its other limits stay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sglang_case import results_file, sglang_job
from test_megatron_moe_gpu import SHAPE, random_qwen3_moe

from rljob_api.resource import parse_spec

LAYERS, TOPK, EXPERTS = SHAPE["num_hidden_layers"], SHAPE["num_experts_per_tok"], SHAPE["num_experts"]


@pytest.mark.gpu
def test_replayed_routes_reach_the_trainer_and_keep_its_log_probs_at_sglang_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("megatron.core")
    import ray

    from rljob_api import support

    def lift_the_gpu_limit() -> None:  # in each Ray worker; nested, so Ray ships it by value
        from rljob_api import support

        support.LIMITS = tuple(
            lim
            for lim in support.LIMITS
            if not (lim.field == ".training.routingReplay" and "not yet shown on GPUs" in lim.what)
        )

    kept = [
        lim
        for lim in support.LIMITS
        if not ("not yet shown on GPUs" in lim.what and "routingReplay" in lim.what)
    ]
    monkeypatch.setattr(support, "LIMITS", tuple(kept))  # this process: prepare and the driver
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.placement import bundle_shapes, local_resources
    from rljob_runtime.prepare import prepare
    from rljob_runtime.trainer import group as group_mod

    model_dir = random_qwen3_moe(tmp_path / "qwen3-moe")
    records: list[dict[str, Any]] = []
    real_build = group_mod.build_batch

    def build_batch(samples: Any, *args: Any, **kwargs: Any) -> Any:
        from rljob_runtime.engine_api import routed_experts

        batch = real_build(samples, *args, **kwargs)
        decoded = (
            None
            if batch.routed_experts is None
            else [
                routed_experts(r, len(s.tokens)) for r, s in zip(batch.routed_experts, samples, strict=True)
            ]
        )
        records.append(
            {
                "samples": len(samples),
                "with_record": 0 if decoded is None else len(decoded),
                "shapes_ok": decoded is not None
                and all(
                    tuple(r.shape) == (len(s.tokens) - 1, LAYERS * TOPK)
                    for r, s in zip(decoded, samples, strict=True)
                ),
                "in_range": decoded is not None
                and all(int(r.min()) >= 0 and int(r.max()) < EXPERTS for r in decoded),
            }
        )
        return batch

    monkeypatch.setattr(group_mod, "build_batch", build_batch)
    gaps: dict[bool, float] = {}
    ray_started = False
    try:
        for replay in (False, True):
            records.clear()
            doc = sglang_job(tmp_path / f"replay-{replay}", backend="megatron", steps=1)
            doc["model"]["path"] = str(model_dir)
            spec = parse_spec(doc)  # admission's rules refuse routingReplay: set on a copy
            spec = spec.model_copy(
                update={"training": spec.training.model_copy(update={"routing_replay": replay})}
            )
            if not ray_started:  # one Ray for both runs, its workers' limit lifted as this process's
                ray.init(
                    num_cpus=len(bundle_shapes(spec)) + 2,
                    resources=local_resources(spec),
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env={"worker_process_setup_hook": lift_the_gpu_limit},
                )
                ray_started = True
            result = run(prepare(spec), RunOptions())
            gaps[replay] = float(result.history[0]["train/rollout_logp_abs_diff"])
            row = {"replay": replay, "gap": gaps[replay], "batches": records[:2]}
            print("routing-replay run", json.dumps(row), flush=True)
            if replay:
                assert records and all(r["with_record"] == r["samples"] for r in records), records
                assert all(r["shapes_ok"] and r["in_range"] for r in records), records
            else:
                assert records and all(r["with_record"] == 0 for r in records), records
    finally:
        if ray_started:
            ray.shutdown()
    results_file("routing-replay", {"gaps": {str(k): v for k, v in gaps.items()}})
    assert gaps[True] <= gaps[False] * 1.1 + 1e-4, gaps
