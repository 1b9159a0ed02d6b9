"""RolloutManager on a local Ray: 2 hf engines (colocated CPU spec) behind the real sglang-router.

One manager serves the whole module (engines take seconds to start on 2 busy cores); the tests run
in file order and build on each other's state: generation, weight updates through the transports
(the CPU tensor format and disk), a kill mid-rollout, a kill of an idle engine, a dead engine
actor, restarts exhausted, then shutdown. The "trainer" the transports ask for weights is a model
directory's weights (``Weights``); a relaunched engine is refreshed by the last transport used.
Random-weight 2-layer models (SmolLM2's tokenizer) make every generation cheap.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
import transformers
from rollout_on_ray import rollout_on_ray

from rljob_runtime.config import config_from_document
from rljob_runtime.data.sample import Sample, Status
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.rollout.errors import EngineRestartsExhausted, RolloutError
from rljob_runtime.rollout.generate import RetryPolicy
from rljob_runtime.rollout.manager import RolloutManager
from rljob_runtime.sync.base import WeightTransport
from rljob_runtime.sync.disk import DiskTransport, write_weights_dir
from rljob_runtime.sync.tensor import TensorTransport

PROMPTS = [
    [1780, 314, 216, 34, 27, 35, 47],  # "What is 2+3?"
    [1780, 314, 216, 36, 27, 37],
    [504, 3714, 284],
    [22, 23, 24, 25],
]
OK = (Status.COMPLETED, Status.TRUNCATED)
DISK = DiskTransport()  # one scratch directory for the module, as a run has


class Weights:
    """What the transports ask of a trainer: here the weights of a model directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Copies, as the trainer's (a tied lm_head is its own tensor, as safetensors wants)."""
        return {k: v.clone() for k, v in load(self.path).state_dict().items()}

    def write_weights(self, directory: str | None, model_path: str | None) -> tuple[str, int]:
        """As trainer rank 0 does for the disk transport (trainer/weight_source.py)."""
        return write_weights_dir(self.named_tensors(), directory, model_path)

    def remove_weights(self, directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Env:
    manager: RolloutManager
    model_a: Path
    model_b: Path
    log_dir: Path
    source: Weights


def push(env: Env, transport: WeightTransport, model: Path, version: int | str | None = None) -> str:
    """The "trainer" now holds ``model``'s weights; push them (relaunched engines are refreshed the
    same way); the manager's new version."""
    env.source.path = model
    env.manager.refresher = lambda url: transport.refresh(env.source, env.manager, url)
    transport.push(env.source, env.manager, version)
    return env.manager.weight_version


def _spec(model: Path) -> Any:
    doc = {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {"path": "/nonexistent/train.jsonl"},
        "rollout": {
            "engine": "hf",
            "batchSize": 4,
            "nSamplesPerPrompt": 2,
            "maxResponseLen": 12,
            "router": {"policy": "round_robin"},
            # the hf server's batch; the client reads it back as the engine's running capacity
            "sglangArgs": {"max-running-requests": "16"},
        },
        "training": {"backend": "torch", "globalBatchSize": 8, "microBatchSize": 1},
        "resources": {"device": "cpu", "colocate": True, "trainer": {"nodes": 1, "gpusPerNode": 2}},
        "faultTolerance": {
            # a killed engine fails its check at once (connection refused); the long timeout is for
            # live engines slowed by other tests beside this module (a second pytest-xdist worker)
            "engineHealthCheck": {"firstWaitSeconds": 0, "intervalSeconds": 1, "timeoutSeconds": 90},
            "maxEngineRestarts": 3,
        },
    }
    return config_from_document(doc).spec


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("rollout")
    model_a = make_tiny_model(tmp / "model-a", seed=1)
    model_b = make_tiny_model(tmp / "model-b", seed=2)
    spec = _spec(model_a)
    retry = RetryPolicy(max_attempts=60, backoff_s=0.5)
    with rollout_on_ray(spec, model_a, tmp / "logs", retry=retry, engines=2) as manager:
        yield Env(manager, model_a, model_b, tmp / "logs", Weights(model_a))


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def served(url: str) -> int:
    return int(get(f"{url}/server_info")["internal_states"][0]["num_requests_total"])


def running(url: str) -> int:
    return int(get(f"{url}/v1/loads")["loads"][0]["num_running_reqs"])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def make_samples(n: int) -> list[Sample]:
    return [
        Sample(group_index=i // 2, index=i, prompt=f"p{i}", prompt_ids=list(PROMPTS[i % len(PROMPTS)]))
        for i in range(n)
    ]


def load(path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def teacher_forced_logprobs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    with torch.no_grad():
        ids = torch.tensor([prompt + response])
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def greedy_reference(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


def greedy_samples(manager: RolloutManager, n: int = 4) -> list[Sample]:
    samples = [Sample(index=i, prompt_ids=list(PROMPTS[0])) for i in range(n)]
    return manager.generate(samples, temperature=0.0, max_new_tokens=8, ignore_eos=True)


def test_a_two_engines_generate_a_batch(env: Env) -> None:
    manager = env.manager
    assert manager.fleet.router.worker_urls() == manager.engine_urls() or sorted(
        manager.fleet.router.worker_urls()
    ) == sorted(manager.engine_urls())
    # training.seed (the default, 42) reaches the engines: engine i samples from seed + i
    assert [get(f"{u}/server_info")["seed"] for u in manager.engine_urls()] == [42, 43]
    # requests in flight: what the two engines say they run at once (16 each), not the fallback (64 each)
    assert manager.client.concurrency == 32
    before = [served(u) for u in manager.engine_urls()]
    samples = make_samples(16)
    out = manager.generate(samples)
    assert out == samples and [s.index for s in out] == list(range(16))
    for sample in out:
        assert sample.status in OK, sample
        assert 0 < sample.response_length == len(sample.response_ids) <= 12
        assert sample.rollout_logprobs is not None and len(sample.rollout_logprobs) == sample.response_length
        assert all(lp <= 0.0 for lp in sample.rollout_logprobs)
        assert sample.weight_versions == ["default"]
        assert sample.tokens == sample.prompt_ids + sample.response_ids
    # logprobs belong to the response tokens: recompute two of them with plain transformers
    model = load(env.model_a)
    for sample in out[:2]:
        expected = teacher_forced_logprobs(model, sample.prompt_ids, sample.response_ids)
        assert sample.rollout_logprobs == pytest.approx(expected, abs=1e-4)
    after = [served(u) for u in manager.engine_urls()]
    assert all(a > b for a, b in zip(after, before, strict=True)), (
        f"not both engines served: {before} -> {after}"
    )


def test_c_weight_update_from_tensors_changes_greedy_outputs(env: Env) -> None:
    manager = env.manager
    tokens_a = greedy_reference(load(env.model_a), PROMPTS[0], 8)
    tokens_b = greedy_reference(load(env.model_b), PROMPTS[0], 8)
    assert tokens_a != tokens_b
    assert all(s.response_ids == tokens_a for s in greedy_samples(manager))
    version = push(env, TensorTransport(), env.model_b)
    assert version == "1"  # bumped from "default"
    for url in manager.engine_urls():
        assert get(f"{url}/model_info")["weight_version"] == "1"
    out = greedy_samples(manager)
    assert all(s.response_ids == tokens_b and s.weight_versions == ["1"] for s in out)
    # back to A with an explicit version, then B through a safetensors directory (bumped to 3)
    assert push(env, TensorTransport(), env.model_a, 2) == "2"
    assert all(s.response_ids == tokens_a and s.weight_versions == ["2"] for s in greedy_samples(manager))
    assert push(env, DISK, env.model_b) == "3"
    assert all(s.response_ids == tokens_b and s.weight_versions == ["3"] for s in greedy_samples(manager))
    # colocated engines free and take back their memory around training (no-ops on hf, same calls)
    manager.release_memory()
    manager.resume_memory(["weights"])
    manager.resume_memory(["kv_cache", "cuda_graph"])
    assert all(s.weight_versions == ["3"] for s in greedy_samples(manager, 2))


def test_c2_update_during_a_rollout_retries_the_aborted_requests(env: Env) -> None:
    manager = env.manager
    samples = make_samples(8)
    future = manager.generate_async(samples, max_new_tokens=200, ignore_eos=True)
    url = manager.engine_urls()[0]
    deadline = time.monotonic() + 30
    while running(url) == 0:
        assert time.monotonic() < deadline and not future.done()
        time.sleep(0.05)
    # pause_generation (mode abort) aborts what runs; generate resends it, the paused engine holds it
    version = push(env, DISK, env.model_a, "4")
    out = future.result(timeout=120)
    assert all(s.status is Status.TRUNCATED and s.response_length == 200 for s in out)
    retried = [s for s in out if s.metadata["rollout_tries"] > 1]
    assert retried, "no request was aborted by the update"
    assert all(s.weight_versions == [version] for s in retried), "a resent request runs on the new weights"


def test_b_engine_killed_mid_rollout_loses_no_sample(env: Env) -> None:
    manager = env.manager
    version = push(env, TensorTransport(), env.model_b, "5")
    tokens_b = greedy_reference(load(env.model_b), PROMPTS[0], 8)
    old_urls = manager.engine_urls()
    restarts = manager.fleet.restarts
    samples = make_samples(24)
    future = manager.generate_async(samples, max_new_tokens=300, ignore_eos=True)
    deadline = time.monotonic() + 30
    while running(old_urls[1]) == 0:
        assert time.monotonic() < deadline and not future.done(), "engine 1 never got work"
        time.sleep(0.05)
    started = time.monotonic()
    manager.kill_engine_process(1)
    out = future.result(timeout=120)
    elapsed = time.monotonic() - started
    print(f"engine killed mid-rollout -> all 24 samples back in {elapsed:.1f} s")
    assert len(out) == 24 and all(s.status is Status.TRUNCATED and s.response_length == 300 for s in out)
    assert all(len(s.rollout_logprobs or []) == 300 for s in out)
    assert any(s.metadata["rollout_tries"] > 1 for s in out), "no request was retried: the kill came too late"
    # replaced at once (not at the next weight update): wait for registration if generation beat it
    deadline = time.monotonic() + 60
    while manager.fleet.engines[1].state != "serving":
        assert time.monotonic() < deadline, manager.engine_info()
        time.sleep(0.2)
    assert manager.fleet.restarts == restarts + 1 and manager.fleet.engines[1].restarts == 1
    new_url = manager.engine_urls()[1]
    assert new_url != old_urls[1] and manager.engine_urls()[0] == old_urls[0]
    assert sorted(manager.fleet.router.worker_urls()) == sorted(manager.engine_urls())
    info = manager.engine_info()[1]
    assert info["alive"] and info["launches"] == 2
    # the new engine serves the current weights: the transport refreshed it from the "trainer"
    assert get(f"{new_url}/model_info")["weight_version"] == version == "5"
    before = served(new_url)
    out = greedy_samples(manager, 4)
    assert all(s.response_ids == tokens_b and s.weight_versions == ["5"] for s in out)
    assert served(new_url) > before, "the replacement gets traffic through the router"
    print(f"engine killed mid-rollout -> replaced in {manager.fleet.engines[1].last_replacement_s:.1f} s")


def test_b2_idle_engine_killed_after_a_disk_update_gets_those_weights(env: Env) -> None:
    manager = env.manager
    version = push(env, DISK, env.model_a, "6")
    tokens_a = greedy_reference(load(env.model_a), PROMPTS[0], 8)
    old_url, restarts = manager.engine_urls()[0], manager.fleet.restarts
    started = time.monotonic()
    manager.kill_engine_process(0)
    deadline = time.monotonic() + 60
    while manager.engine_urls()[0] == old_url or manager.fleet.engines[0].state != "serving":
        assert time.monotonic() < deadline, manager.engine_info()
        time.sleep(0.2)
    print(f"idle engine killed -> replaced in {manager.fleet.engines[0].last_replacement_s:.1f} s", end=" ")
    print(f"(kill to registered: {time.monotonic() - started:.1f} s)")
    assert manager.fleet.restarts == restarts + 1
    new_url = manager.engine_urls()[0]
    assert get(f"{new_url}/model_info")["weight_version"] == version
    assert all(s.response_ids == tokens_a and s.weight_versions == [version] for s in greedy_samples(manager))


def test_b3_dead_actor_takes_its_server_along_and_is_recreated_on_its_bundle(env: Env) -> None:
    manager = env.manager
    engine = manager.fleet.engines[1]
    old_actor, old_url, old_pid = engine.actor, engine.url, manager.engine_info()[1]["pid"]
    ray.kill(old_actor, no_restart=True)  # SIGKILL of the actor process: no cleanup code runs
    deadline = time.monotonic() + 15
    while _alive(old_pid):
        assert time.monotonic() < deadline, "the server outlived its actor (PDEATHSIG)"
        time.sleep(0.05)
    deadline = time.monotonic() + 60
    while engine.url == old_url or engine.state != "serving":
        assert time.monotonic() < deadline, engine
        time.sleep(0.2)
    assert engine.actor is not old_actor
    info = manager.engine_info()[1]
    assert info["launches"] == 1 and info["alive"] and info["pid"] != old_pid
    assert get(f"{engine.url}/model_info")["weight_version"] == manager.weight_version == "6"
    assert sorted(manager.fleet.router.worker_urls()) == sorted(manager.engine_urls())


def test_restarts_exhausted_fail_the_run(env: Env) -> None:
    manager = env.manager
    manager.fleet.max_restarts = manager.fleet.restarts  # no replacement left
    manager.kill_engine_process(0)
    deadline = time.monotonic() + 30
    while manager.client.fatal is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(EngineRestartsExhausted, match="maxEngineRestarts=3 replacements are used up"):
        manager.check_failed()
    with pytest.raises(EngineRestartsExhausted):
        manager.generate(make_samples(2))
    assert manager.fleet.engines[0].state == "failed"
    assert manager.engine_urls()[0] not in manager.fleet.router.worker_urls()


def test_d_shutdown_leaves_no_process(env: Env) -> None:
    manager = env.manager
    pids = [info["pid"] for info in manager.engine_info()] + [manager.fleet.router.pid()]
    assert all(isinstance(pid, int) for pid in pids)
    assert _alive(pids[1]) and _alive(pids[2])  # engine 1 and the router (engine 0 was killed)
    manager.shutdown()
    manager.shutdown()  # idempotent
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if _alive(pid)]
        time.sleep(0.1)
    with pytest.raises((RolloutError, EngineRestartsExhausted)):
        manager.generate(make_samples(1))
