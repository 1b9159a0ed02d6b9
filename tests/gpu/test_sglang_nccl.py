"""Disaggregated weight sync into stock SGLang by NCCL on two GPUs (trainer on one, the engine on
the other): through the driver, every sync leaves the engine's greedy tokens equal to a fresh
server's on the trainer's exported weights; and an engine killed in the middle of a broadcast is
noticed in seconds (its request fails, the trainer's side of the group is aborted), replaced and
brought to the pushed version through a group of its own."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sglang_case import (
    KIT_ARGS,
    export_dir,
    fresh_server_tokens,
    greedy,
    http,
    results_file,
    sglang_job,
    smollm2,
)

from rljob_api.resource import parse_spec


def _two_gpus() -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: the trainer on one, the engine on the other")


def test_every_nccl_sync_matches_a_fresh_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _two_gpus()
    from rljob_runtime.colocation import Turns
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    args = {**KIT_ARGS, "disable-cuda-graph": ""}
    doc = sglang_job(
        tmp_path, backend="torch", colocate=False, steps=3, sglang_args={"disable-cuda-graph": ""}
    )
    prepared = prepare(parse_spec(doc))
    checks: list[dict[str, Any]] = []
    real = Turns.to_engines

    def to_engines(self: Turns, sync: Any) -> dict[str, float]:
        out = real(self, sync)
        url = self.rollout.engine_urls()[0]
        version = http("GET", f"{url}/model_info")["weight_version"]
        exported = export_dir(self.trainer, prepared.model_path, tmp_path / f"export-{version}")
        checks.append(
            {
                "version": version,
                "equal": greedy(url) == fresh_server_tokens(exported, tmp_path / f"fresh-{version}", args),
                "group_init_s": out.get("time/sync_group_init"),
            }
        )
        return out

    monkeypatch.setattr(Turns, "to_engines", to_engines)
    result = run(prepared, RunOptions())
    print("nccl syncs:", json.dumps(checks), flush=True)
    results_file("sglang-nccl-grpo", {"checks": checks, "history": result.history})
    assert result.steps_done == 3 and [c["version"] for c in checks] == ["1", "2", "3"]
    assert all(c["equal"] for c in checks), checks
    assert checks[0]["group_init_s"] > 0 and checks[1]["group_init_s"] == 0.0  # the group is built once


def _perturbed(model: str, dest: Path) -> Path:
    """``model`` with every weight moved a little: the trainer starts from it, the engine does not."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, dest)
    for path in dest.glob("*.safetensors"):
        state = load_file(str(path))
        gen = torch.Generator().manual_seed(7)
        save_file(
            {k: v + 0.02 * torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in state.items()},
            str(path),
        )
    return dest


def test_an_engine_dying_in_a_broadcast_is_noticed_in_seconds(tmp_path: Path) -> None:
    _two_gpus()
    import ray

    from rljob_runtime import placement as placement_mod
    from rljob_runtime.rollout.manager import RolloutManager
    from rljob_runtime.sync import make_transport
    from rljob_runtime.trainer import create_trainer

    model = smollm2()
    trainer_model = _perturbed(model, tmp_path / "trainer-model")
    doc = sglang_job(
        tmp_path, backend="torch", colocate=False, steps=1, sglang_args={"disable-cuda-graph": ""}
    )
    spec = parse_spec(doc)
    ray.init(
        num_cpus=6,
        resources=placement_mod.local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
    )
    trainer = manager = None
    try:
        placement = placement_mod.create_placement(spec, timeout_s=120)
        trainer = create_trainer(spec, str(trainer_model), placement.trainer)
        manager = RolloutManager.create(
            spec, model, placement, log_dir=tmp_path / "logs", startup_timeout_s=600
        )
        # small buckets: a broadcast of hundreds of requests, long enough to die in
        transport = make_transport(spec, single_node=True, bucket_bytes=256 << 10)
        manager.refresher = lambda url: transport.refresh(trainer, manager, url)
        transport.push(trainer, manager, 1)  # the group exists; the engine serves version 1
        old_url = manager.engine_urls()[0]
        outcome: dict[str, Any] = {}

        def push() -> None:
            try:
                outcome["metrics"] = transport.push(trainer, manager, 2)
            except Exception as exc:
                outcome["error"] = f"{type(exc).__name__}: {exc}"[:500]
            outcome["returned_at"] = time.monotonic()

        thread = threading.Thread(target=push)
        thread.start()
        time.sleep(0.5)
        killed_at = time.monotonic()
        manager.kill_engine_process(0)
        thread.join(timeout=300)
        noticed_s = outcome["returned_at"] - killed_at
        deadline = time.monotonic() + 600
        while manager.fleet.engines[0].state != "serving" or manager.engine_urls()[0] == old_url:
            assert time.monotonic() < deadline, manager.engine_info()
            time.sleep(0.5)
        new_url = manager.engine_urls()[0]
        served = http("GET", f"{new_url}/model_info")["weight_version"]
        exported = export_dir(trainer, model, tmp_path / "export")
        equal = greedy(new_url) == fresh_server_tokens(
            exported, tmp_path / "fresh", {**KIT_ARGS, "disable-cuda-graph": ""}
        )
        report = {"noticed_s": round(noticed_s, 2), "push": outcome, "served_version": served, "equal": equal}
        print("broadcast kill:", json.dumps(report, default=str), flush=True)
        results_file("sglang-nccl-kill", report)
        assert noticed_s < 60, f"the push waited {noticed_s:.0f} s for a dead engine"
        assert "error" not in outcome and outcome["metrics"]["sync/engines_lost"] == 1, outcome
        assert served == manager.weight_version == "2" and equal
        transport.push(trainer, manager, 3)  # the shared group is rebuilt with the new member
        assert http("GET", f"{new_url}/model_info")["weight_version"] == "3"
    finally:
        if manager is not None:
            manager.shutdown()
        if trainer is not None:
            trainer.shutdown()
        ray.shutdown()
