"""The frame of a weight update (``RolloutManager.updating`` + ``EngineUpdate``) without engines: the
requests each engine gets and in what order, engines dying mid-update, a collective transfer losing a
member, a relaunched engine brought up to date, and memory release waiting for a health check.
The engines' HTTP is a recorder; the real engines: tests/integration/test_rollout_manager.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.rollout.engines import Engine, HealthCheck
from rljob_runtime.rollout.errors import EngineGone, WeightUpdateError
from rljob_runtime.rollout.manager import RolloutManager

A, B = "http://a", "http://b"


class Router:
    url = "http://router"

    def stop(self) -> None:
        pass


class Engines:
    """Answers every engine request: 200 unless told otherwise per (url, path)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, Any]] = []
        self.answers: dict[tuple[str, str], list[Any]] = {}
        self.hang: set[tuple[str, str]] = set()

    def answer(self, url: str, path: str, *results: Any) -> None:
        self.answers[(url, path)] = list(results)

    async def request(self, url: str, method: str, path: str, body: Any = None, timeout: float = 600) -> Any:
        self.log.append((url, path, body))
        if (url, path) in self.hang:
            await asyncio.sleep(3600)
        queue = self.answers.get((url, path))
        result = queue.pop(0) if queue else 200
        if isinstance(result, BaseException):
            raise result
        return result, {"success": result == 200}

    def paths(self, url: str) -> list[str]:
        return [p for u, p, _ in self.log if u == url]


def _spec() -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/unused"},
            "data": {"path": "/unused.jsonl"},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2},
            "training": {"backend": "torch", "globalBatchSize": 4, "microBatchSize": 1},
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}},
        }
    )


@pytest.fixture()
def setup(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RolloutManager, Engines, list[str]]]:
    engines = [Engine(0, None, None, A, tp_size=1), Engine(1, None, None, B, tp_size=2)]
    manager = RolloutManager(
        spec=_spec(),
        router=Router(),  # type: ignore[arg-type]
        engines=engines,
        actor_kwargs=lambda i: {"tp_size": engines[i].tp_size},
        health=HealthCheck(enabled=False),
    )
    fake = Engines()
    replaced: list[str] = []
    monkeypatch.setattr(manager.client, "request", fake.request)

    def start_replacement(engine: Engine, reason: str) -> Any:
        replaced.append(engine.url)
        engine.state = "replacing"

    monkeypatch.setattr(manager.fleet, "start_replacement", start_replacement)
    monkeypatch.setattr("rljob_runtime.rollout.engine_update.FLUSH_BACKOFF_S", 0.0)
    yield manager, fake, replaced
    manager.client.close()


def test_an_update_pauses_flushes_transfers_versions_and_continues(setup: Any) -> None:
    manager, fake, _ = setup
    fake.answer(A, "/flush_cache", 400, 400, 200)  # busy twice: retried until idle
    with manager.updating(7) as update:
        assert update.urls == [A, B] and update.tp_sizes == {A: 1, B: 2}
        assert all(e.state == "updating" for e in manager.fleet.engines)
        update.post("/update_weights_from_tensor", lambda url: {"n": update.tp_sizes[url]})
    assert fake.paths(A) == [
        "/pause_generation",
        "/flush_cache",
        "/flush_cache",
        "/flush_cache",
        "/update_weights_from_tensor",
        "/update_weight_version",
        "/continue_generation",
    ]
    assert [b for u, p, b in fake.log if p == "/update_weights_from_tensor"] in (
        [{"n": 1}, {"n": 2}],
        [{"n": 2}, {"n": 1}],
    )
    assert next(b for u, p, b in fake.log if p == "/update_weight_version") == {
        "new_version": "7",
        "abort_all_requests": False,
    }
    assert manager.weight_version == "7" and all(e.state == "serving" for e in manager.fleet.engines)
    with manager.updating() as update:  # no version given: the next integer
        pass
    assert manager.weight_version == "8"


def test_a_failed_transfer_keeps_the_old_version_and_lets_generation_go_on(setup: Any) -> None:
    manager, fake, replaced = setup
    fake.answer(B, "/update_weights_from_disk", 400)
    with pytest.raises(WeightUpdateError, match="http://b"), manager.updating(3) as update:
        update.post("/update_weights_from_disk", {})
    assert manager.weight_version == "default" and not replaced
    assert fake.paths(A)[-1] == "/continue_generation" and "/update_weight_version" not in fake.paths(A)
    assert all(e.state == "serving" for e in manager.fleet.engines)
    assert not manager.fleet.weights_lock.locked()


def test_an_engine_dead_mid_update_is_dropped_and_replaced_after(setup: Any) -> None:
    manager, fake, replaced = setup
    fake.answer(B, "/update_weights_from_tensor", EngineGone("connection refused"))
    with manager.updating(2) as update:
        update.post("/update_weights_from_tensor", {})
        assert update.live == [A]
        update.post("/update_weights_from_tensor", {})  # later requests skip it
    assert fake.paths(B).count("/update_weights_from_tensor") == 1
    assert "/continue_generation" not in fake.paths(B) and replaced == [B]
    assert manager.weight_version == "2"  # the replacement brings B to it


def test_a_collective_transfer_that_loses_a_member_unblocks_the_sender_at_once(setup: Any) -> None:
    manager, fake, replaced = setup
    fake.answer(A, "/update_weights_from_distributed", EngineGone("reset by peer"))
    fake.hang.add((B, "/update_weights_from_distributed"))  # B waits in the broadcast, as NCCL would
    aborted: list[str] = []
    with manager.updating(4) as update:
        update.post_each(
            "/update_weights_from_distributed",
            [{"bucket": 0}, {"bucket": 1}],
            collective=True,
            on_lost=lambda: aborted.append("abort"),
        )
        assert sorted(update.lost) == [A, B]
    assert aborted == ["abort"] and sorted(replaced) == [A, B]


def test_post_each_sends_each_engine_its_sequence_in_order(setup: Any) -> None:
    manager, fake, _ = setup
    with manager.updating(1) as update:
        update.post_each("/update_weights_from_distributed", [{"i": 0}, {"i": 1}, {"i": 2}], collective=True)
    for url in (A, B):
        got = [b["i"] for u, p, b in fake.log if u == url and p == "/update_weights_from_distributed"]
        assert got == [0, 1, 2]


def test_a_relaunched_engine_is_brought_to_the_current_version_alone(setup: Any) -> None:
    manager, fake, _ = setup
    manager.client.weight_version = "5"
    engine = manager.fleet.engines[1]
    engine.state, engine.pending_url = "replacing", "http://b2"
    with manager.updating(only="http://b2") as update:
        assert update.tp_sizes == {"http://b2": 2}
        update.post("/update_weights_from_disk", {})
    assert fake.paths("http://b2") == ["/update_weights_from_disk", "/update_weight_version"]
    assert next(b for u, p, b in fake.log if p == "/update_weight_version")["new_version"] == "5"
    fake.answer("http://b2", "/update_weights_from_disk", EngineGone("died again"))
    with pytest.raises(EngineGone), manager.updating(only="http://b2") as update:
        update.post("/update_weights_from_disk", {})


def test_relaunched_engines_get_weights_only_once_there_are_new_ones(setup: Any) -> None:
    manager, _, _ = setup
    called: list[str] = []
    manager.client.call(manager.fleet.push_current_weights("http://x", 0))
    manager.client.weight_version = "3"
    with pytest.raises(WeightUpdateError, match="no refresher"):
        manager.client.call(manager.fleet.push_current_weights("http://x", 0))
    manager.refresher = called.append
    manager.client.call(manager.fleet.push_current_weights("http://x", 0))
    assert called == ["http://x"]


def test_memory_release_waits_for_idle_and_for_a_running_health_check(setup: Any) -> None:
    manager, fake, _ = setup
    fake.answer(A, "/flush_cache", 400, 200)
    engine = manager.fleet.engines[0]

    async def hold() -> None:  # a health check's generation in flight
        assert engine.busy is not None
        async with engine.busy:
            await asyncio.sleep(0.3)

    held = manager.client.submit(hold())
    manager.release_memory()
    assert held.done()  # the release waited for it
    assert fake.paths(A) == ["/flush_cache", "/flush_cache", "/release_memory_occupation"]
    assert manager.fleet.health_paused
    manager.resume_memory(["weights"])
    assert manager.fleet.health_paused  # no KV cache yet: no health checks
    manager.resume_memory(["kv_cache", "cuda_graph"])
    assert not manager.fleet.health_paused
    bodies = [b for u, p, b in fake.log if u == A and p == "/resume_memory_occupation"]
    assert bodies == [{"tags": ["weights"]}, {"tags": ["kv_cache", "cuda_graph"]}]


def test_an_engine_refusing_the_pause_fails_the_update_and_the_others_go_on(setup: Any) -> None:
    manager, fake, _ = setup
    fake.answer(B, "/pause_generation", 400)
    with pytest.raises(WeightUpdateError, match="http://b"), manager.updating(9):
        pass
    assert fake.paths(A)[-1] == "/continue_generation" and manager.weight_version == "default"
    assert not manager.fleet.weights_lock.locked()


def test_routing_replay_sends_a_group_to_one_serving_engine_without_the_router(setup: Any) -> None:
    """training.routingReplay: the pinned sglang-router drops return_routed_experts, so the client
    asks the fleet for each sample's engine: its prompt group's among those serving."""
    from rljob_runtime.data.sample import Sample

    manager, _, _ = setup
    assert manager.client.engine_for is None  # through the router
    spec = manager.spec
    replay = spec.model_copy(update={"training": spec.training.model_copy(update={"routing_replay": True})})
    engines = [Engine(0, None, None, A, tp_size=1), Engine(1, None, None, B, tp_size=1)]
    direct = RolloutManager(
        spec=replay,
        router=Router(),  # type: ignore[arg-type]
        engines=engines,
        actor_kwargs=lambda i: {"tp_size": 1},
        health=HealthCheck(enabled=False),
    )
    try:
        choose = direct.client.engine_for
        assert choose is not None
        assert [choose(Sample(index=i, group_index=i // 2)) for i in range(4)] == [A, A, B, B]
        engines[0].state = "replacing"  # its groups go to an engine that serves meanwhile
        assert choose(Sample(index=0, group_index=0)) == B
    finally:
        direct.client.close()
