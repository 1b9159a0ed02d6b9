"""GPU weight sync through the runtime's driver (prepare / run): the CPU demo's config
(tests/learning.py demo_spec: SmolLM2-135M-Instruct, single-digit addition, 8 prompts x 4 samples,
float32) with rollout.engine hf and resources.device cuda, for each backend (torch, megatron) and
placement:
- colocate true, one GPU: ``sync.choose_transport`` picks ``cuda_ipc`` (trainer rank 0 shares
  flattened CUDA buckets, the engine copies them into its parameters);
- colocate false, two GPUs (trainer on one, the engine on the other): ``nccl`` (rank 0 hosts a
  weight-update group with the engine and broadcasts flattened buckets).

Asserted: the run completes; every step's sync went through the expected path (the transport, and
the metrics only that path reports: ``time/sync_share`` for IPC, ``time/sync_group_init`` for
NCCL, ``sync/buckets`` for both); step 1's
``train/ppo_kl`` is 0; the samples of step k were generated with weight version k - 1; after the
last sync a fresh generation carries the last version. As a weight check without a weights
endpoint (the hf server has no /get_weights_by_name): the engine's per-token log-probs (fp32,
temperature 1; the demo's rollout temperature 0.8 is set to 1.0 here so the trainer scores at 1 too)
against the trainer's on the same tokens, every step and after the last sync; they agree only if
the engine holds the trainer's current weights.

Steps: RLJOB_IPC_STEPS (default 4). Per-step numbers go to stdout and, when RLJOB_RESULTS_DIR is
set, to a JSON file there (``<backend>-<transport>-grpo.json``).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from learning import demo_spec

pytest.importorskip("ray")

from rljob_api.resource import parse_spec

STEPS = int(os.environ.get("RLJOB_IPC_STEPS", "4"))
KEYS = (
    "reward/mean",
    "train/ppo_kl",
    "time/step",
    "time/generate",
    "time/train",
    "time/sync",
    "time/sync_share",
    "time/sync_group_init",
    "sync/bytes",
    "sync/gb_per_s",
    "sync/buckets",
)


def _logp_gap(trainer: Any, samples: list[Any]) -> float:
    """Mean |trainer logp - engine logp| over the trained response tokens."""

    from rljob_runtime.trainer.base import build_batch

    batch = build_batch(samples)
    logp = trainer.logprobs(samples).logp.float().cpu()
    width = logp.shape[1]
    mask = batch.loss_mask[:, :width].float()
    engine = batch.rollout_logp[:, :width].float()
    return float(((logp - engine).abs() * mask).sum() / mask.sum().clamp(min=1))


@pytest.mark.parametrize(
    ("backend", "colocate"),
    [("torch", True), ("torch", False), ("megatron", True), ("megatron", False)],
    ids=["torch-ipc", "torch-nccl", "megatron-ipc", "megatron-nccl"],
)
def test_gpu_sync_through_the_driver(
    backend: str, colocate: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import rljob_runtime.driver as driver
    from rljob_runtime.data.sample import Sample
    from rljob_runtime.models.errors import ModelNotFoundError
    from rljob_runtime.models.resolve import resolve_model
    from rljob_runtime.sync.checksum import checksums

    doc = demo_spec("grpo", 1, tmp_path / "ckpt", steps=STEPS)
    if not colocate and torch.cuda.device_count() < 2:
        pytest.skip("the NCCL path needs two GPUs (trainer and engine)")
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    expected = "cuda_ipc" if colocate else "nccl"
    doc["training"]["backend"] = backend
    doc["rollout"]["engine"] = "hf"
    doc["resources"]["device"] = "cuda"
    doc["resources"]["colocate"] = colocate
    doc["resources"]["trainer"] = {"nodes": 1, "gpusPerNode": 1}
    if not colocate:
        doc["resources"]["rollout"] = {"gpus": 1, "gpusPerNode": 1}
    # The hf engine returns temperature-1 log-probs, the trainer scores at the rollout temperature:
    # sample at 1.0 (the demo: 0.8) so that the two compare, and any gap is weights or numerics.
    doc["rollout"]["temperature"] = 1.0
    try:
        resolve_model(doc["model"]["path"])
    except ModelNotFoundError as err:
        pytest.skip(f"SmolLM2-135M-Instruct is not available offline here: {err}")

    versions: list[list[list[str]]] = []  # per step: each sample's weight_versions
    gaps: list[float] = []  # per step: engine vs trainer logp, before the step's update
    pushes: list[dict[str, Any]] = []
    last: dict[str, Any] = {}

    real_metrics = driver.rollout_metrics
    real_train = driver._train
    real_make_transport = driver.make_transport

    def rollout_metrics(samples: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
        versions.append([list(s.weight_versions) for s in samples])
        last["samples"] = list(samples)
        return real_metrics(samples, *args, **kwargs)

    def train(spec: Any, trainer: Any, samples: list[Any]) -> dict[str, float]:
        gaps.append(_logp_gap(trainer, samples))
        return real_train(spec, trainer, samples)

    def make_transport(*args: Any, **kwargs: Any) -> Any:
        transport = real_make_transport(*args, **kwargs)
        real_push = transport.push

        def push(trainer: Any, rollout: Any, version: int) -> dict[str, float]:
            out = real_push(trainer, rollout, version)
            pushes.append({"version": version, "transport": transport.name})
            after_push(trainer, rollout, version)
            return out

        transport.push = push  # type: ignore[method-assign]
        return transport

    def after_push(trainer: Any, rollout: Any, version: int) -> None:
        if version == STEPS:  # after the last sync: the engine holds exactly the trainer's tensors
            want = {k: list(v) for k, v in checksums(trainer.named_tensors().items()).items()}
            with urllib.request.urlopen(f"{rollout.engine_urls()[0]}/weights_checksum", timeout=120) as resp:
                served = json.loads(resp.read())["checksums"]
            # every tensor the trainer holds, by its name (megatron's export has no tied lm_head alias)
            last["checksums_equal"] = all(served.get(k) == v for k, v in want.items())
        if version == STEPS:  # and a fresh generation must use the new weights
            fresh = [
                Sample(
                    group_index=s.group_index,
                    index=s.index,
                    prompt=s.prompt,
                    prompt_ids=list(s.prompt_ids),
                    label=s.label,
                )
                for s in last["samples"]
            ]
            rollout.generate(fresh)
            last["versions"] = [list(s.weight_versions) for s in fresh]
            last["gap"] = _logp_gap(trainer, fresh)
            last["stale_gap"] = _logp_gap(
                trainer, last["samples"]
            )  # made by version STEPS - 1: the scale of one update

    monkeypatch.setattr(driver, "rollout_metrics", rollout_metrics)
    monkeypatch.setattr(driver, "_train", train)
    monkeypatch.setattr(driver, "make_transport", make_transport)

    from rljob_runtime.driver import RunOptions, run
    from rljob_runtime.prepare import prepare

    result = run(prepare(parse_spec(doc)), RunOptions())

    rows = [{k: round(float(h.get(k, float("nan"))), 6) for k in ("step", *KEYS)} for h in result.history]
    for i, row in enumerate(rows):
        row["logp_gap_engine_vs_trainer"] = round(gaps[i], 6) if i < len(gaps) else None
        row["weight_versions"] = sorted({v for vs in versions[i] for v in vs}) if i < len(versions) else None
        print(f"{backend}-{expected}", json.dumps(row), flush=True)
    print(f"{backend}-{expected} pushes", json.dumps(pushes), flush=True)
    print(
        f"{backend}-{expected} after last sync",
        json.dumps(
            {
                "versions": sorted({v for vs in last.get("versions", []) for v in vs}),
                "gap": last.get("gap"),
                "stale_gap": last.get("stale_gap"),
            }
        ),
        flush=True,
    )
    out = os.environ.get("RLJOB_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{backend}-{expected}-grpo.json").write_text(
            json.dumps(
                {
                    "rows": rows,
                    "pushes": pushes,
                    "after_last_sync": {k: v for k, v in last.items() if k != "samples"},
                },
                indent=1,
            )
        )

    assert result.steps_done == STEPS and len(result.history) == STEPS
    assert [p["version"] for p in pushes] == list(range(1, STEPS + 1))
    assert all(p["transport"] == expected for p in pushes), pushes
    only_this_path = "time/sync_share" if colocate else "time/sync_group_init"
    for h in result.history:
        assert "sync/buckets" in h and only_this_path in h, sorted(h)
        assert h["sync/buckets"] >= 1 and h["sync/bytes"] > 0
    assert abs(result.history[0]["train/ppo_kl"]) < 1e-6, result.history[0]["train/ppo_kl"]
    # Step k's samples were generated after sync k - 1 (step 1: the engine's initial weights).
    assert all(vs == ["default"] for vs in versions[0]), versions[0]
    for k in range(2, STEPS + 1):
        assert all(vs == [str(k - 1)] for vs in versions[k - 1]), (k, versions[k - 1])
    assert last["versions"] and all(vs == [str(STEPS)] for vs in last["versions"]), last["versions"]
    assert last["checksums_equal"], "the engine's weights differ from the trainer's after the last sync"
    # The engine's log-probs match the trainer's current weights (fp32 both sides) at every step.
    assert all(g < 1e-3 for g in gaps) and last["gap"] < 1e-3, (gaps, last["gap"])
