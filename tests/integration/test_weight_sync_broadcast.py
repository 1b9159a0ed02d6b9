"""Disaggregated weight sync (``sync/nccl.py``) end to end on CPU: the real torch trainer rank (a Ray
actor) hosts the weight-update group, two real hf engines join it through
``/init_weights_update_group`` and receive flattened buckets through
``/update_weights_from_distributed``, driven by ``DistributedTransport`` and ``RolloutManager`` as in
a run.

Only the collective backend differs from a GPU run: gloo instead of NCCL (``group_backend="gloo"``);
the endpoints, bucket plan, byte layout, ordering and group rebuild are the code that runs on GPUs.
The trainer starts from model B and the engines from model A, so equal checksums prove a transfer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from rljob_runtime import placement as placement_mod
from rljob_runtime.config import config_from_document
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.rollout.generate import RetryPolicy
from rljob_runtime.rollout.manager import RolloutManager
from rljob_runtime.sync import make_transport
from rljob_runtime.sync.checksum import checksums
from rljob_runtime.trainer import create_trainer


def _spec(model: Path) -> Any:
    return config_from_document(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/nonexistent/train.jsonl"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2, "maxResponseLen": 8},
            "training": {"backend": "torch", "globalBatchSize": 4, "microBatchSize": 1},
            "resources": {
                "device": "cpu",
                "colocate": False,
                "trainer": {"nodes": 1, "gpusPerNode": 1},
                "rollout": {"gpus": 2, "gpusPerNode": 2},
            },
            "faultTolerance": {
                "engineHealthCheck": {"firstWaitSeconds": 0, "intervalSeconds": 1, "timeoutSeconds": 20},
                "maxEngineRestarts": 2,
            },
        }
    ).spec


def _served(url: str) -> dict[str, list[int]]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/weights_checksum", timeout=60) as resp:
        return json.loads(resp.read())["checksums"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return make_tiny_model(root / "a", seed=1), make_tiny_model(root / "b", seed=2)


@pytest.fixture()
def setup(models: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[Any, Any, Any]]:
    """As the driver composes them: one placement, the trainer on its slots, the engines on theirs."""
    model_a, model_b = models
    spec = _spec(model_a)
    ray.init(
        num_cpus=4,
        resources=placement_mod.local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}},
    )
    trainer = manager = None
    try:
        placement = placement_mod.create_placement(spec, timeout_s=60)
        trainer = create_trainer(spec, str(model_b), placement.trainer)
        manager = RolloutManager.create(
            spec,
            model_a,
            placement,
            retry=RetryPolicy(max_attempts=60, backoff_s=0.5),
            log_dir=tmp_path / "logs",
        )
        yield spec, trainer, manager
    except BaseException:
        for log in sorted((tmp_path / "logs").rglob("*.log")):
            sys.stderr.write(f"---- {log}\n{log.read_text(errors='replace')[-3000:]}\n")
        raise
    finally:
        if manager is not None:
            manager.shutdown()
        if trainer is not None:
            trainer.shutdown()
        ray.shutdown()


def test_broadcast_sync_reaches_every_engine_and_survives_a_relaunch(setup: tuple[Any, Any, Any]) -> None:
    spec, trainer, manager = setup
    want = {k: list(v) for k, v in checksums(trainer.named_tensors().items()).items()}
    urls = manager.engine_urls()
    assert len(urls) == 2 and all(_served(u) != want for u in urls), "engines must start from other weights"

    sync = make_transport(
        spec, single_node=True, transport="nccl", group_backend="gloo", bucket_bytes=64 << 10
    )
    manager.refresher = lambda url: sync.refresh(trainer, manager, url)
    first = sync.push(trainer, manager, version=1)
    assert first["time/sync_group_init"] > 0 and first["sync/buckets"] > 2  # several buckets, in order
    assert first["sync/bytes"] == sum(t.numel() * t.element_size() for t in trainer.named_tensors().values())
    for url in urls:
        assert _served(url) == want
    second = sync.push(trainer, manager, version=2)
    assert second["time/sync_group_init"] == 0.0  # the same group, no new rendezvous

    # a relaunched engine gets version 2 through a group of its own; the next push rebuilds the shared
    # group with the new member
    epoch = manager.membership_epoch
    manager.kill_engine_process(1)
    deadline = time.monotonic() + 120
    while manager.membership_epoch == epoch or manager.fleet.engines[1].state != "serving":
        assert time.monotonic() < deadline, manager.engine_info()
        time.sleep(0.2)
    for url in manager.engine_urls():
        assert _served(url) == want
    third = sync.push(trainer, manager, version=3)
    assert third["time/sync_group_init"] > 0
    for url in manager.engine_urls():
        assert _served(url) == want
    assert manager.weight_version == "3"
