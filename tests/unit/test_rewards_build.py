"""build_reward: validation up front, score() filling sample.reward, remote and custom rewards."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from rljob_api.spec_workload import RewardSpec
from rljob_runtime.data.rewards import RewardError, build_reward, reward_needs_label, scalar_reward
from rljob_runtime.data.rewards.remote import RemoteReward
from rljob_runtime.data.sample import Sample


def _samples(*pairs: tuple[str, object], group_size: int = 1) -> list[Sample]:
    return [
        Sample(group_index=i // group_size, index=i, response=r, label=lab)
        for i, (r, lab) in enumerate(pairs)
    ]


def _score(fn, samples: list[Sample]) -> list[float]:  # type: ignore[no-untyped-def]
    return asyncio.run(fn.score(samples))


@pytest.mark.parametrize(
    ("kind", "response", "label", "expected"),
    [
        ("math", r"\boxed{2}", "2", 1.0),
        ("dapo", "Answer: 3", "2", -1.0),
        ("deepscaler", r"\boxed{2}", "2", 1.0),
        ("exact_match", " yes ", "yes", 1.0),
        ("f1", "a cat", "cat", 1.0),
    ],
)
def test_rule_rewards_fill_sample(kind: str, response: str, label: str, expected: float) -> None:
    samples = _samples((response, label))
    assert _score(build_reward(RewardSpec(type=kind)), samples) == [expected]
    assert samples[0].reward == expected
    assert reward_needs_label(RewardSpec(type=kind))


def test_needs_label_only_for_rule_rewards() -> None:
    assert not reward_needs_label(RewardSpec(type="remote", url="http://x"))
    assert not reward_needs_label(RewardSpec(type="custom", function="m:f"))


def test_validation_errors_name_the_problem() -> None:
    with pytest.raises(RewardError, match="unknown"):
        build_reward(RewardSpec.model_construct(type="nope"))
    with pytest.raises(RewardError, match=r"remote needs reward\.url"):
        build_reward(RewardSpec.model_construct(type="remote", url=None))
    with pytest.raises(RewardError, match=r"custom needs reward\.function"):
        build_reward(RewardSpec.model_construct(type="custom", function=None))
    with pytest.raises(RewardError, match="cannot import module 'no_such_mod_xyz'"):
        build_reward(RewardSpec(type="custom", function="no_such_mod_xyz:f"))
    with pytest.raises(RewardError, match="has no attribute 'nope'"):
        build_reward(RewardSpec(type="custom", function="json:nope"))
    with pytest.raises(RewardError, match="not callable"):
        build_reward(RewardSpec(type="custom", function="json.decoder:WHITESPACE_STR"))


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = "user_rewards_" + tmp_path.name.replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import asyncio

            def length(sample):
                return float(len(sample.response))

            async def async_len(sample):
                await asyncio.sleep(0)
                return {"score": len(sample.response), "acc": True}

            def slime_style(args, sample):
                return 1.0 if sample.response == sample.label else 0.0

            def per_group(samples):
                best = max(len(s.response) for s in samples)
                return [float(len(s.response) == best) for s in samples]

            def broken(sample):
                raise ValueError("boom")

            async def hangs(sample):
                await asyncio.sleep(60)

            def wrong_type(sample):
                return "high"

            def short_group(samples):
                return [1.0]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _custom(module: str, fn: str, **kw: object) -> object:
    return build_reward(RewardSpec(type="custom", function=f"{module}:{fn}", **kw))


def test_custom_sync_async_dict_and_slime_style(user_module: str) -> None:
    samples = _samples(("ab", None), ("abc", None))
    assert _score(_custom(user_module, "length"), samples) == [2.0, 3.0]
    assert _score(_custom(user_module, "async_len", rewardKey="score"), samples) == [2.0, 3.0]
    assert samples[1].metadata["reward_details"] == {"score": 3, "acc": True}
    assert _score(_custom(user_module, "slime_style"), _samples(("x", "x"), ("y", "x"))) == [1.0, 0.0]


def test_custom_group(user_module: str) -> None:
    samples = _samples(("a", None), ("abc", None), ("ab", None), ("a", None), group_size=2)
    assert _score(_custom(user_module, "per_group", group=True), samples) == [0.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("fn", "kw", "match"),
    [
        ("broken", {}, r"raised ValueError\('boom'\)"),
        ("hangs", {"timeoutSeconds": 0.05}, "timed out after 0.05 s"),
        ("wrong_type", {}, "expected a number or a dict"),
        ("async_len", {}, "without key 'reward'.*set reward.rewardKey"),
        ("short_group", {"group": True}, "expected a list of 2 rewards, got 1"),
    ],
)
def test_custom_failures_raise_clearly(user_module: str, fn: str, kw: dict, match: str) -> None:
    with pytest.raises(RewardError, match=match):
        _score(_custom(user_module, fn, **kw), _samples(("a", None), ("b", None), group_size=2))


class _Handler(BaseHTTPRequestHandler):
    failures_left = 0
    bodies: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            self.send_response(500)
            self.end_headers()
            return
        payload = json.dumps({"reward": len(body["response"]), "extra": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.failures_left, _Handler.bodies = 0, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/score"
    httpd.shutdown()
    httpd.server_close()


def test_remote_posts_sample_json_and_retries(server: str) -> None:
    _Handler.failures_left = 2
    fn = RemoteReward(server, timeout=5, max_retries=2, backoff_seconds=0.0)
    samples = _samples(("abcd", "x"))
    assert _score(fn, samples) == [4.0]
    assert len(_Handler.bodies) == 3 and _Handler.bodies[-1]["label"] == "x"


def test_remote_gives_up_naming_the_url(server: str) -> None:
    _Handler.failures_left = 10
    fn = RemoteReward(server, timeout=5, max_retries=1, backoff_seconds=0.0)
    with pytest.raises(RewardError, match=re.escape(f"remote reward {server} failed after 2 attempt")):
        _score(fn, _samples(("a", None)))


def test_remote_unreachable_times_out() -> None:
    fn = build_reward(RewardSpec(type="remote", url="http://127.0.0.1:9/x", maxRetries=0, timeoutSeconds=1))
    with pytest.raises(RewardError, match=re.escape("http://127.0.0.1:9/x")):
        _score(fn, _samples(("a", None)))


def test_scalar_reward_reduces_dicts() -> None:
    assert scalar_reward(Sample(reward={"acc": 1, "reward": 0.5})) == 0.5
    assert scalar_reward(Sample(reward={"acc": 1}), "acc") == 1.0
    with pytest.raises(RewardError, match="has no reward"):
        scalar_reward(Sample())


def test_hanging_sync_function_times_out_without_blocking_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sync_hang_mod.py").write_text("import time\ndef f(sample):\n    time.sleep(30)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = build_reward(RewardSpec(type="custom", function="sync_hang_mod:f", timeoutSeconds=0.05))
    with pytest.raises(RewardError, match="timed out"):
        _score(fn, _samples(("a", None)))  # asyncio.run returns: the stuck thread is a daemon
    sys.modules.pop("sync_hang_mod", None)


def test_a_call_that_outlives_its_loop_ends_quietly() -> None:
    """A reward call still running when its timeout fired and asyncio.run closed the loop finishes
    later without an error in its thread ('Event loop is closed')."""
    import contextlib
    import time

    from rljob_runtime.data.rewards.base import run_in_daemon_thread

    errors: list[BaseException | None] = []
    finished = threading.Event()
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)

    def slow() -> float:
        time.sleep(0.3)
        finished.set()
        return 1.0

    async def main() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run_in_daemon_thread(slow), timeout=0.05)

    try:
        asyncio.run(main())  # returns, and closes the loop, while slow() still runs
        assert finished.wait(5)
        time.sleep(0.1)  # the thread's delivery runs after finished is set
    finally:
        threading.excepthook = previous
    assert errors == []
