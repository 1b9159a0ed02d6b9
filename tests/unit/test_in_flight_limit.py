"""How many requests the rollout client keeps in flight: what the engines say they run at once.

At a fixed 512 per engine the runtime's path made about half of stock SGLang's tokens/s on a
rollout of 2048 requests that stock sent all at once (the GPU rollout issue's figures). The key read is checked against SGLang's
source in test_sglang_contract.py; the hf server's answer in tests/integration/test_rollout_manager.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime import engine_api
from rljob_runtime.rollout.client import EngineClient
from rljob_runtime.rollout.errors import EngineGone
from rljob_runtime.rollout.generate import RetryPolicy

KEY = engine_api.RUNNING_CAPACITY_KEY


def _states(*counts: Any) -> dict[str, Any]:
    return {"model_path": "/m", "internal_states": [{KEY: c, "last_gen_throughput": 0.0} for c in counts]}


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (_states(2048), 2048),
        (_states(2048, 4096), 6144),  # one entry per data-parallel scheduler
        (_states(2048, None), None),  # one scheduler that does not say: unknown, not a guess
        (_states(0), None),
        (_states(True), None),
        (_states("2048"), None),
        ({"internal_states": []}, None),
        ({"model_path": "/m"}, None),
        ({"internal_states": "x"}, None),
        ("not json", None),
        (None, None),
    ],
)
def test_running_capacity_from_server_info(info: Any, expected: int | None) -> None:
    assert engine_api.running_capacity(info) == expected


def _client() -> EngineClient:
    spec = RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/unused"},
            "data": {"path": "/unused.jsonl"},
            "rollout": {"engine": "sglang"},
            "training": {"backend": "torch"},
            "resources": {"trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )
    return EngineClient(
        spec=spec,
        router_url="http://router",
        retry=RetryPolicy(),
        concurrency=1,
        model_path=None,
        on_interrupt=lambda: None,
    )


def test_the_limit_is_the_engines_capacities_summed_with_a_fallback_for_one_that_does_not_say(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    answers: dict[str, Any] = {
        "http://a": (200, _states(2048, 2048)),  # two DP schedulers
        "http://b": (200, _states(3000)),
        "http://c": (404, {"detail": "Not Found"}),  # another server: no /server_info
        "http://d": EngineGone("GET http://d/server_info: ClientConnectorError"),
    }
    asked: list[tuple[str, str, str]] = []

    async def request(url: str, method: str, path: str, body: Any = None, timeout: float = 600) -> Any:
        asked.append((url, method, path))
        answer = answers[url]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    client = _client()
    monkeypatch.setattr(client, "request", request)
    try:
        with caplog.at_level("INFO", logger="rljob.rollout.manager"):
            client.set_in_flight_limit(list(answers), fallback_per_engine=512)
        assert client.concurrency == 4096 + 3000 + 512 + 512
        assert sorted(asked) == [(u, "GET", "/server_info") for u in sorted(answers)]
        assert "up to 8120 requests in flight (engines run 4096, 3000, ? (assumed 512), ? (assumed 512)" in (
            caplog.text
        )
    finally:
        client.close()
