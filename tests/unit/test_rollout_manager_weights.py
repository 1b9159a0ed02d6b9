"""RolloutManager's weight bookkeeping without engines: version bumps, and which update a relaunched
engine gets (the last disk path, the remembered tensors, or the driver's weights_provider)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from rljob_runtime.rollout import protocol
from rljob_runtime.rollout.manager import Engine, RolloutManager
from rljob_runtime.rollout.weight_updates import WeightUpdate


def bare_manager(provider: Any = None) -> tuple[RolloutManager, list[tuple[str, WeightUpdate]]]:
    """A manager with no engines, router or loop; engine transfers are recorded instead of sent."""
    manager = RolloutManager.__new__(RolloutManager)
    manager.weight_version = protocol.DEFAULT_WEIGHT_VERSION
    manager._last_update = None
    manager.weights_provider = provider
    manager.engines = []
    manager._fatal = None
    manager._closed = False
    sent: list[tuple[str, WeightUpdate]] = []

    async def record(url: str, update: WeightUpdate) -> None:
        sent.append((url, update))

    manager._update_engine = record  # type: ignore[method-assign]
    return manager, sent


def record_requests(manager: RolloutManager) -> list[tuple[str, Any]]:
    """Make ``manager``'s engine requests succeed and record (path, body) in the order they are sent."""
    posted: list[tuple[str, Any]] = []

    async def expect(url: str, method: str, path: str, body: Any) -> Any:
        posted.append((path, body))
        return {"success": True}

    async def engine_request(url: str, method: str, path: str, *a: Any, **k: Any) -> tuple[int, Any]:
        posted.append((path, None))
        return 200, {}

    manager._expect = expect  # type: ignore[method-assign]
    manager._engine_request = engine_request  # type: ignore[method-assign]
    return posted


async def _update(manager: RolloutManager, update: WeightUpdate) -> str:
    manager._weights_lock = asyncio.Lock()
    return await manager._update_all(update)


def test_versions_bump_from_default_and_explicit_ones_win() -> None:
    manager, _ = bare_manager()
    assert manager._next_version(None) == "1"
    manager.weight_version = "41"
    assert manager._next_version(None) == "42"
    assert manager._next_version(7) == "7" and manager._next_version("v9") == "v9"
    manager.weight_version = "v9"
    assert manager._next_version(None) == "1"


def test_relaunched_engine_gets_nothing_before_any_update() -> None:
    manager, sent = bare_manager()
    asyncio.run(manager._push_current_weights("http://new"))
    assert sent == []


def test_relaunched_engine_replays_the_last_disk_update() -> None:
    manager, sent = bare_manager()
    asyncio.run(_update(manager, WeightUpdate("disk", "3", model_path="/ckpt/iter_3")))
    assert manager.weight_version == "3"
    asyncio.run(manager._push_current_weights("http://new"))
    assert sent == [("http://new", WeightUpdate("disk", "3", model_path="/ckpt/iter_3"))]


def test_relaunched_engine_replays_remembered_tensors_without_a_provider() -> None:
    manager, sent = bare_manager()
    update = WeightUpdate("tensors", "2", serialized=("payload",), load_format="flattened_bucket")
    asyncio.run(_update(manager, update))
    asyncio.run(manager._push_current_weights("http://new"))
    assert sent == [("http://new", update)]


def test_with_a_provider_no_copy_is_kept_and_the_provider_is_asked_again() -> None:
    calls = 0

    def provider() -> list[tuple[str, torch.Tensor]]:
        nonlocal calls
        calls += 1
        return [("w", torch.full((2,), 5.0))]

    manager, sent = bare_manager(provider)
    asyncio.run(_update(manager, WeightUpdate("tensors", "4", serialized=("old payload",))))
    assert manager._last_update == WeightUpdate("tensors", "4")  # no payload kept
    asyncio.run(manager._push_current_weights("http://new"))
    assert calls == 1
    ((url, update),) = sent
    assert url == "http://new" and update.version == "4" and update.load_format is None
    ((name, tensor),) = protocol.deserialize_named_tensors(update.serialized[0], None)
    assert name == "w" and tensor.tolist() == [5.0, 5.0]


def test_update_skips_engines_being_replaced() -> None:
    manager, sent = bare_manager()
    manager.engines = [
        Engine(0, None, None, "http://a"),
        Engine(1, None, None, "http://b", state="replacing"),
    ]
    asyncio.run(_update(manager, WeightUpdate("disk", "1", model_path="/m")))
    assert [url for url, _ in sent] == ["http://a"]
    assert [e.state for e in manager.engines] == ["serving", "replacing"]


@pytest.mark.parametrize("state", ["replacing", "failed"])
def test_states_outside_serving_are_not_live(state: str) -> None:
    manager, _ = bare_manager()
    manager.engines = [Engine(0, None, None, "http://a"), Engine(1, None, None, "http://b", state=state)]  # type: ignore[arg-type]
    assert [e.url for e in manager._live()] == ["http://a"]
