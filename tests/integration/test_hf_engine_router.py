"""Two `hf` engines behind the real sglang-router: generation, weight updates, abort, pause, membership.

Everything runs on loopback with free ports and random-weight 2-layer models (SmolLM2's tokenizer),
so the whole module takes well under a minute on 2 CPU cores. Every process started here is stopped
in the fixture's teardown, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# No importorskip: CI installs the runtime extra (make venv), and a missing piece must fail loudly.
import sglang_router  # noqa: F401  (the real router; launched as a process below)
import torch
import transformers

from rljob_runtime import engine_api
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.sync.checksum import checksums

HOST = "127.0.0.1"
PROMPT = [1780, 314, 216, 34, 27, 35, 47]  # "What is 2+3?" in SmolLM2's tokenizer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http(method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def post(url: str, body: Any = None, timeout: float = 30) -> Any:
    status, answer = http("POST", url, body if body is not None else {}, timeout)
    assert 200 <= status < 300, f"POST {url}: {status} {answer}"
    return answer


def get(url: str, timeout: float = 30) -> Any:
    status, answer = http("GET", url, timeout=timeout)
    assert status == 200, f"GET {url}: {status} {answer}"
    return answer


def wait_for(
    what: str, check: Callable[[], bool], timeout: float = 60, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}")
        with contextlib.suppress(OSError, AssertionError):
            if check():
                return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Cluster:
    engines: list[str]
    router: str
    model_a: Path
    model_b: Path


def _start(cmd: list[str], log: Path, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    procs.append(proc)
    return proc


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("hf-router")
    model_a = make_tiny_model(tmp / "model-a", seed=1)
    model_b = make_tiny_model(tmp / "model-b", seed=2)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines = []
        for index in range(2):
            port = free_port()
            cmd = [sys.executable, "-m", "rljob_runtime.rollout.hf_server", "--model-path", str(model_a)]
            cmd += ["--host", HOST, "--port", str(port), "--seed", str(index), "--threads", "1"]
            _start(cmd, tmp / f"engine{index}.log", procs)
            engines.append(f"http://{HOST}:{port}")
        router_port, metrics_port = free_port(), free_port()
        router_cmd = [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            HOST,
            "--port",
            str(router_port),
        ]
        router_cmd += [
            "--policy",
            "round_robin",
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(metrics_port),
        ]
        router_cmd += ["--log-level", "warn"]
        router_proc = _start(router_cmd, tmp / "router.log", procs)
        router = f"http://{HOST}:{router_port}"
        for url, proc in zip(engines, procs, strict=False):
            wait_for(
                f"{url}/health_generate",
                lambda u=url: http("GET", f"{u}/health_generate")[0] == 200,
                proc=proc,
            )
        wait_for("router up", lambda: http("GET", f"{router}/workers")[0] == 200, proc=router_proc)
        for url in engines:
            post(f"{router}/workers", {"url": url, "worker_type": "regular"})

        def both_healthy() -> bool:
            workers = get(f"{router}/workers")["workers"]
            return sorted(w["url"] for w in workers if w.get("is_healthy")) == sorted(engines)

        wait_for("both workers healthy in the router", both_healthy, timeout=60, proc=router_proc)
        yield Cluster(engines=engines, router=router, model_a=model_a, model_b=model_b)
    except BaseException:
        for log in sorted(tmp.glob("*.log")):
            sys.stderr.write(f"---- {log.name}\n{log.read_text(errors='replace')[-3000:]}\n")
        raise
    finally:
        _stop(procs)


@pytest.fixture(autouse=True)
def _restore(cluster: Cluster) -> Iterator[None]:
    """Each test leaves the engines unpaused with model A's weights."""
    yield
    for url in cluster.engines:
        post(f"{url}/continue_generation")
        post(
            f"{url}/update_weights_from_disk", engine_api.update_weights_from_disk_body(str(cluster.model_a))
        )


@contextlib.contextmanager
def reference_model(path: Path) -> Iterator[Any]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    yield model


def reference_greedy(path: Path, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their temperature-1 logprobs, computed by plain transformers."""
    with reference_model(path) as model, torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        tokens = out[0, len(prompt) :].tolist()
        logits = model(out).logits[0, len(prompt) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    return tokens, logprobs


def greedy(url: str, n: int = 12) -> dict[str, Any]:
    params = engine_api.sampling_params(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    return post(f"{url}/generate", engine_api.generate_body(input_ids=PROMPT, params=params))


def served(url: str) -> int:
    return int(get(f"{url}/server_info")["internal_states"][0]["num_requests_total"])


def test_generate_through_router_round_robin(cluster: Cluster) -> None:
    before = [served(url) for url in cluster.engines]
    params = engine_api.sampling_params(temperature=1.0, top_p=0.9, max_new_tokens=16, ignore_eos=True)
    bodies = [engine_api.generate_body(input_ids=PROMPT[: 3 + i % 4], params=params) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: post(f"{cluster.router}/generate", b), bodies))
    for body, answer in zip(bodies, answers, strict=True):
        meta = answer["meta_info"]
        assert meta["finish_reason"]["type"] == "length"
        assert meta["completion_tokens"] == 16 == len(answer["output_ids"])
        assert meta["prompt_tokens"] == len(body["input_ids"])
        logprobs = meta["output_token_logprobs"]
        assert len(logprobs) == 16
        assert [entry[1] for entry in logprobs] == answer["output_ids"]
        assert all(entry[0] <= 0.0 for entry in logprobs)
        assert meta["weight_version"] == "default"
        assert isinstance(answer["text"], str) and answer["text"]
    after = [served(url) for url in cluster.engines]
    assert all(a > b for a, b in zip(after, before, strict=True)), (
        f"not both engines served: {before} -> {after}"
    )
    assert sum(after) - sum(before) == 8


def test_text_input_stop_and_seed(cluster: Cluster) -> None:
    url = cluster.engines[0]
    params = engine_api.sampling_params(temperature=0.8, max_new_tokens=10, ignore_eos=True, sampling_seed=7)
    first = post(f"{url}/generate", engine_api.generate_body(text="What is 2+3?", params=params))
    second = post(
        f"{cluster.engines[1]}/generate", engine_api.generate_body(text="What is 2+3?", params=params)
    )
    assert first["meta_info"]["prompt_tokens"] == len(PROMPT)
    assert first["output_ids"] == second["output_ids"], "same sampling_seed, same weights: same tokens"
    # stop on the 3rd generated token id: finishes with 'stop', the token kept in output_ids, trimmed from text
    stop_id = first["output_ids"][2]
    params = engine_api.sampling_params(
        temperature=0.8, max_new_tokens=10, stop_token_ids=[stop_id], sampling_seed=7
    )
    stopped = post(f"{url}/generate", engine_api.generate_body(text="What is 2+3?", params=params))
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert stopped["output_ids"] == first["output_ids"][: first["output_ids"].index(stop_id) + 1]


def test_greedy_and_logprobs_match_transformers(cluster: Cluster) -> None:
    tokens, logprobs = reference_greedy(cluster.model_a, PROMPT, 12)
    answer = greedy(cluster.router)
    assert answer["output_ids"] == tokens
    got = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(logprobs, abs=1e-4)


def test_update_weights_from_disk_and_tensor(cluster: Cluster) -> None:
    tokens_a, _ = reference_greedy(cluster.model_a, PROMPT, 12)
    tokens_b, logprobs_b = reference_greedy(cluster.model_b, PROMPT, 12)
    assert tokens_a != tokens_b, "the two random models should disagree"
    for url in cluster.engines:
        post(f"{url}/pause_generation")
        wait_for("flush_cache", lambda u=url: http("POST", f"{u}/flush_cache")[0] == 200, timeout=10)
        answer = post(
            f"{url}/update_weights_from_disk",
            engine_api.update_weights_from_disk_body(str(cluster.model_b), weight_version="2"),
        )
        assert answer["success"] is True
        post(f"{url}/continue_generation")
        assert get(f"{url}/model_info")["weight_version"] == "2"
    for _ in range(2):  # both engines, via the router
        answer = greedy(cluster.router)
        assert answer["output_ids"] == tokens_b
        assert answer["meta_info"]["weight_version"] == "2"
        assert [e[0] for e in answer["meta_info"]["output_token_logprobs"]] == pytest.approx(
            logprobs_b, abs=1e-4
        )

    # back to model A by tensors: direct pairs on one engine, a flattened bucket on the other
    with reference_model(cluster.model_a) as model:
        named = list(model.state_dict().items())
    for url, flat, version in [(cluster.engines[0], False, "3"), (cluster.engines[1], True, "3")]:
        data = engine_api.serialize_named_tensors(named, flattened_bucket=flat)
        body = engine_api.update_weights_from_tensor_body(
            [data], load_format="flattened_bucket" if flat else None, weight_version=version
        )
        assert post(f"{url}/update_weights_from_tensor", body)["success"] is True
        answer = greedy(url)
        assert answer["output_ids"] == tokens_a
        assert answer["meta_info"]["weight_version"] == "3"
        served = get(f"{url}/weights_checksum")
        assert served["checksums"] == {k: list(v) for k, v in checksums(named).items()}
    one = get(f"{cluster.engines[0]}/weights_checksum?names=model.norm.weight")["checksums"]
    assert list(one) == ["model.norm.weight"]
    assert http("GET", f"{cluster.engines[0]}/weights_checksum?names=nope")[0] == 404
    # weight-update groups: bad requests are refused with what is wrong, before anything blocks
    status, answer = http("POST", f"{cluster.engines[0]}/init_weights_update_group", {"master_port": 1})
    assert status == 400 and "master_address" in answer["message"] and "world_size" in answer["message"]
    nccl = engine_api.init_weights_update_group_body(
        master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2, group_name="g"
    )
    status, answer = http("POST", f"{cluster.engines[0]}/init_weights_update_group", nccl)
    assert status == 400 and "needs a CUDA engine" in answer["message"]
    body = engine_api.update_weights_from_distributed_body(
        names=["model.norm.weight"], dtypes=["float32"], shapes=[[64]], group_name="g"
    )
    status, answer = http("POST", f"{cluster.engines[0]}/update_weights_from_distributed", body)
    assert status == 400 and "POST /init_weights_update_group first" in answer["message"]
    status, answer = http("POST", f"{cluster.engines[0]}/destroy_weights_update_group", {"group_name": "g"})
    assert status == 400 and "no group 'g'" in answer["message"]
    bad = engine_api.update_weights_from_tensor_body(
        [engine_api.serialize_named_tensors([("nope", torch.zeros(2))])]
    )
    status, answer = http("POST", f"{cluster.engines[0]}/update_weights_from_tensor", bad)
    assert status == 400 and "nope" in answer["message"]
    assert get(f"{cluster.engines[0]}/model_info")["weight_version"] == "3"


def _long_request(url: str, rid: str, results: dict[str, Any]) -> threading.Thread:
    params = engine_api.sampling_params(temperature=1.0, max_new_tokens=1500, ignore_eos=True)
    body = engine_api.generate_body(input_ids=PROMPT, params=params, rid=rid)
    thread = threading.Thread(
        target=lambda: results.__setitem__(rid, post(f"{url}/generate", body, timeout=120))
    )
    thread.start()
    return thread


def _running(url: str) -> int:
    return int(get(f"{url}/v1/loads")["loads"][0]["num_running_reqs"])


def test_abort_and_flush_cache(cluster: Cluster) -> None:
    url = cluster.engines[0]
    results: dict[str, Any] = {}
    thread = _long_request(url, "long-1", results)
    wait_for("request running", lambda: _running(url) == 1, timeout=10)
    assert http("GET", f"{url}/flush_cache")[0] == 400, "flush_cache must fail while a request runs"
    post(f"{url}/abort_request", engine_api.abort_body(rid="long-1"))
    thread.join(timeout=30)
    meta = results["long-1"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert 0 < meta["completion_tokens"] < 1500
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    wait_for("flush_cache 200 once idle", lambda: http("GET", f"{url}/flush_cache")[0] == 200, timeout=10)
    # abort_all through the engine, two requests at once
    threads = [_long_request(url, f"long-{i}", results) for i in (2, 3)]
    wait_for("requests running", lambda: _running(url) == 2, timeout=10)
    post(f"{url}/abort_request", engine_api.abort_body())
    for t in threads:
        t.join(timeout=30)
    assert all(results[f"long-{i}"]["meta_info"]["finish_reason"]["type"] == "abort" for i in (2, 3))


def test_pause_in_place_then_continue(cluster: Cluster) -> None:
    url = cluster.engines[1]
    results: dict[str, Any] = {}
    params = engine_api.sampling_params(temperature=1.0, max_new_tokens=400, ignore_eos=True)
    body = engine_api.generate_body(input_ids=PROMPT, params=params, rid="paused-1")
    thread = threading.Thread(
        target=lambda: results.__setitem__("r", post(f"{url}/generate", body, timeout=120))
    )
    thread.start()
    wait_for("request running", lambda: _running(url) == 1, timeout=10)
    post(f"{url}/pause_generation", engine_api.pause_body("in_place"))
    assert http("POST", f"{url}/flush_cache")[0] == 400, "in_place keeps the request: flush must fail"
    time.sleep(0.3)
    assert "r" not in results and thread.is_alive()
    post(f"{url}/continue_generation")
    thread.join(timeout=60)
    meta = results["r"]["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 400
    assert len(meta["output_token_logprobs"]) == 400


def test_pause_abort_holds_new_requests(cluster: Cluster) -> None:
    url = cluster.engines[1]
    results: dict[str, Any] = {}
    thread = _long_request(url, "held-1", results)
    wait_for("request running", lambda: _running(url) == 1, timeout=10)
    post(f"{url}/pause_generation", engine_api.pause_body())  # default mode: abort in-flight requests
    thread.join(timeout=30)
    assert results["held-1"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert http("POST", f"{url}/flush_cache")[0] == 200, "pause (abort) returns once the engine is idle"
    later = threading.Thread(target=lambda: results.__setitem__("later", greedy(url, n=4)))
    later.start()
    time.sleep(0.5)
    assert "later" not in results, "a request sent while paused must wait for continue_generation"
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        post(f"{url}{path}", engine_api.memory_occupation_body())
    post(f"{url}/continue_generation")
    later.join(timeout=30)
    assert results["later"]["meta_info"]["completion_tokens"] == 4


def test_info_endpoints(cluster: Cluster) -> None:
    url = cluster.engines[0]
    for path in ("/get_server_info", "/server_info"):
        info = get(f"{url}{path}")
        assert info["tp_size"] == 1 and info["model_path"] == str(cluster.model_a.resolve())
    for path in ("/get_model_info", "/model_info"):
        info = get(f"{url}{path}")
        assert info["is_generation"] is True and info["architectures"] == ["LlamaForCausalLM"]
    assert http("GET", f"{url}/health")[0] == 200
    loads = get(f"{url}/v1/loads")
    assert loads["loads"][0]["num_waiting_reqs"] == 0
    status, _ = http("POST", f"{url}/generate", {"input_ids": [], "sampling_params": {}})
    assert status == 400


def test_delete_worker(cluster: Cluster) -> None:
    workers = get(f"{cluster.router}/workers")["workers"]
    gone = next(w for w in workers if w["url"] == cluster.engines[1])
    status, answer = http("DELETE", f"{cluster.router}/workers/{gone['id']}")
    assert 200 <= status < 300, answer
    wait_for(
        "worker removed",
        lambda: [w["url"] for w in get(f"{cluster.router}/workers")["workers"]] == [cluster.engines[0]],
        timeout=20,
    )
    before = [served(url) for url in cluster.engines]
    for _ in range(3):
        assert greedy(cluster.router, n=2)["meta_info"]["completion_tokens"] == 2
    after = [served(url) for url in cluster.engines]
    assert after[0] - before[0] == 3 and after[1] == before[1]
