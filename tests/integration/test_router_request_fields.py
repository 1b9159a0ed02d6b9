"""Which ``/generate`` fields the real sglang-router passes to its workers, and which answer fields it
passes back: the runtime's requests go through it (``rollout/router.py``).

The worker is a stand-in for SGLang (SGLang needs a GPU): an aiohttp server that records each
``/generate`` body and answers a fixed one. What the runtime sends comes from ``engine_api`` (the
bodies ``tests/unit/test_sglang_contract.py`` checks against SGLang's own fields).

``return_routed_experts`` (training.routingReplay) is dropped by the pinned sglang-router 0.3.2, while
the answer's ``meta_info.routed_experts`` comes back: with routing replay the rollout sends each
request to an engine directly (``EngineFleet.engine_for``). The test fails when a router release starts
passing the field, so that the bypass is reconsidered.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from rljob_runtime import engine_api
from rljob_runtime.rollout.router import Router

ANSWER = {
    "text": "x",
    "output_ids": [7],
    "meta_info": {
        "id": "a",
        "finish_reason": {"type": "length", "length": 1},
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "output_token_logprobs": [[-0.5, 7, None]],
        "routed_experts": "AAAAAAEAAAA=",
    },
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def routed() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The real router with one stand-in worker; yields the router's URL and the bodies it received."""
    bodies: list[dict[str, Any]] = []
    port = _free_port()
    ready = threading.Event()

    async def generate(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response(ANSWER)

    async def empty(request: web.Request) -> web.Response:
        return web.json_response({})

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/generate", generate)
        for path in ("/health", "/health_generate", "/get_model_info", "/get_server_info", "/v1/models"):
            app.router.add_get(path, empty)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()  # until the process ends (a daemon thread)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(30)
    router = Router.start(policy="round_robin")
    try:
        router.add_worker(f"http://127.0.0.1:{port}")
        yield router.url, bodies
    finally:
        router.stop()


def _generate(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_the_runtime_s_generate_fields_reach_the_worker_but_return_routed_experts(
    routed: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = routed
    params = engine_api.sampling_params(max_new_tokens=1, temperature=0.0)
    body = engine_api.generate_body(input_ids=[1, 2, 3], params=params, rid="r1", return_routed_experts=True)
    answer = _generate(url, body)
    got = bodies[-1]
    for field in ("input_ids", "sampling_params", "return_logprob"):
        assert got[field] == body[field], field
    assert "return_routed_experts" not in got, (
        "the router now passes return_routed_experts: routing replay can go through it (see the module "
        "docstring)"
    )
    # the answer's routing record (and everything the runtime reads) comes back unchanged
    assert answer["meta_info"] == ANSWER["meta_info"]
