"""GRPO through the runtime's driver with stock SGLang engines on one GPU, colocated (the engines
release their memory and the trainer offloads its state in turn, ``colocation.Turns``):

- it learns: the CPU demo's task (SmolLM2-135M-Instruct, single-digit addition, 10 steps of 8 x 4)
  with the megatron and the torch backend, by the project's learning criterion (tests/learning.py);
  every step's samples were made by weight version k - 1; each phase's time and GPU memory recorded;
- after every sync the engine's greedy tokens equal those of a fresh SGLang server loaded from the
  trainer's exported weights, and ``kill -9`` of the engine's server mid-rollout loses no sample: it
  is replaced on its GPU and brought to the current weights (from the offloaded trainer);
- a run stopped at a checkpoint resumes from it (its engines start from the checkpoint's export).

Per-step rows are printed and written to $RLJOB_RESULTS_DIR when set.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from learning import learned
from sglang_case import KIT_ARGS, export_dir, fresh_server_tokens, greedy, http, results_file, sglang_job

from rljob_api.resource import parse_spec

LONG = 1500  # tokens of the generation the engine is killed in (seconds on a GPU)
KEYS = (
    "reward/mean",
    "train/ppo_kl",
    "time/step",
    "time/generate",
    "time/train",
    "time/sync",
    "sync/gb_per_s",
)


def _rows(history: list[dict[str, float]]) -> list[dict[str, float]]:
    return [
        {k: round(float(v), 4) for k, v in h.items() if k in KEYS or k.startswith(("memory/", "time/"))}
        for h in history
    ]


def _record_versions(monkeypatch: pytest.MonkeyPatch) -> list[list[list[str]]]:
    import rljob_runtime.driver as driver

    versions: list[list[list[str]]] = []
    real = driver.rollout_metrics

    def rollout_metrics(samples: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
        versions.append([list(s.weight_versions) for s in samples])
        return real(samples, *args, **kwargs)

    monkeypatch.setattr(driver, "rollout_metrics", rollout_metrics)
    return versions


@pytest.mark.parametrize("backend", ["megatron", "torch"])
def test_grpo_learns_colocated_with_sglang(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    versions = _record_versions(monkeypatch)
    spec = parse_spec(sglang_job(tmp_path, backend=backend))
    result = run(prepare(spec), RunOptions())
    rewards = [h["reward/mean"] for h in result.history]
    ok, why = learned(rewards)
    rows = _rows(result.history)
    for row in rows:
        print(f"{backend}-sglang", json.dumps(row), flush=True)
    print(f"{backend}-sglang learned: {ok}: {why}", flush=True)
    results_file(f"grpo-{backend}-sglang", {"rows": rows, "learned": ok, "why": why})
    assert result.steps_done == 10
    assert all(vs == ["default"] for vs in versions[0])
    for k in range(2, 11):
        assert all(vs == [str(k - 1)] for vs in versions[k - 1]), (k, versions[k - 1])
    for h in result.history:  # the turns happened, and each side let go of the GPU in the other's turn
        assert h["memory/offload_trainer/trainer_gb"] < 0.5 * max(h["memory/onload_trainer/trainer_gb"], 1e-9)
        engines_released, engines_back = (
            h["memory/release_engines/engines_gb"],
            h["memory/resume_engine_kv/engines_gb"],
        )
        if engines_released >= 0:  # -1: NVML could not see the engine's PIDs
            assert engines_released < 0.25 * engines_back, (engines_released, engines_back)
    assert ok, why


def test_every_sync_matches_a_fresh_server_and_a_killed_engine_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rljob_runtime.rollouts_ahead as rollouts_ahead
    from rljob_runtime.colocation import Turns
    from rljob_runtime.data.sample import Sample, Status
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    # no CUDA graphs: the run's engine and the fresh servers must run the same kernels, and start fast
    args = {**KIT_ARGS, "disable-cuda-graph": ""}
    doc = sglang_job(tmp_path, backend="torch", steps=3, sglang_args={"disable-cuda-graph": ""})
    checks: list[dict[str, Any]] = []
    kill: dict[str, Any] = {}
    real_to_engines, real_step_rollout = Turns.to_engines, rollouts_ahead.step_rollout
    prepared = prepare(parse_spec(doc))

    def to_engines(self: Turns, sync: Any) -> dict[str, float]:
        out = real_to_engines(self, sync)
        url = self.rollout.engine_urls()[0]
        version = http("GET", f"{url}/model_info")["weight_version"]
        engine_tokens = greedy(url)
        exported = export_dir(self.trainer, prepared.model_path, tmp_path / f"export-{version}")
        fresh_tokens = fresh_server_tokens(exported, tmp_path / f"fresh-{version}", args)
        checks.append({"version": version, "equal": engine_tokens == fresh_tokens, "tokens": engine_tokens})
        return out

    def step_rollout(prepared: Any, rollout: Any) -> Any:
        if len(checks) == 1 and not kill:  # step 2: kill the engine's server in a long generation
            samples = [Sample(index=i, prompt_ids=list(ids)) for i, ids in enumerate([[22, 23, 24]] * 16)]
            future = rollout.generate_async(samples, max_new_tokens=LONG, ignore_eos=True)
            url = rollout.engine_urls()[0]
            time.sleep(1.0)
            started = time.monotonic()
            rollout.kill_engine_process(0)
            done = future.result(timeout=900)
            kill.update(
                samples=len(done),
                complete=all(s.status is Status.TRUNCATED and s.response_length == LONG for s in done),
                retried=sum(s.metadata.get("rollout_tries", 1) > 1 for s in done),
                back_in_s=round(time.monotonic() - started, 1),
                old_url=url,
            )
            deadline = time.monotonic() + 600
            while rollout.fleet.engines[0].state != "serving":
                assert time.monotonic() < deadline, rollout.engine_info()
                time.sleep(0.5)
            new = rollout.engine_urls()[0]
            kill.update(
                new_url=new,
                version=http("GET", f"{new}/model_info")["weight_version"],
                manager_version=rollout.weight_version,
                replaced_in_s=rollout.fleet.engines[0].last_replacement_s,
                tokens=greedy(new),
            )
        return real_step_rollout(prepared, rollout)

    monkeypatch.setattr(Turns, "to_engines", to_engines)
    monkeypatch.setattr(rollouts_ahead, "step_rollout", step_rollout)  # where the driver takes it
    result = run(prepared, RunOptions())
    print("syncs:", json.dumps([{k: c[k] for k in ("version", "equal")} for c in checks]), flush=True)
    print("kill:", json.dumps({k: v for k, v in kill.items() if k != "tokens"}), flush=True)
    results_file("sglang-sync-and-kill", {"checks": checks, "kill": kill, "rows": _rows(result.history)})
    assert result.steps_done == 3
    assert [c["version"] for c in checks] == ["1", "2", "3"]
    assert all(c["equal"] for c in checks), (
        "the synced engine differs from a fresh server on the same weights"
    )
    assert kill["samples"] == 16 and kill["complete"], kill
    assert kill["new_url"] != kill["old_url"] and kill["version"] == kill["manager_version"] == "1"
    assert kill["tokens"] == checks[0]["tokens"], "the replaced engine serves the current weights"


def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core")
    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    doc = sglang_job(tmp_path, backend="megatron", steps=4, sglang_args={"disable-cuda-graph": ""})
    doc["checkpoint"]["saveInterval"] = 2
    first = run(prepare(parse_spec(doc)), RunOptions(stop_after=2))
    assert first.steps_done == 2 and first.last_checkpoint and first.last_checkpoint.endswith("iter_0000002")
    versions = _record_versions(monkeypatch)
    second = run(prepare(parse_spec(doc)), RunOptions())
    seen = [sorted({v for vs in step for v in vs}) for step in versions]
    print("resumed:", json.dumps({"steps": second.steps_done, "versions": seen}), flush=True)
    assert second.steps_done == 4 and [h["step"] for h in second.history] == [3.0, 4.0]
    assert seen == [["2"], ["3"]], (
        "the resumed engines serve the checkpoint's weights, labelled with its step"
    )
