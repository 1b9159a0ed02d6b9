"""Engine and router command lines (checked against the real parsers where we can), actor options,
and the child-process guarantees: process-group kill and death with the parent (PDEATHSIG)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_router.launch_router import parse_router_args

from rljob_runtime import engine_api
from rljob_runtime.net import free_port
from rljob_runtime.rollout import procs
from rljob_runtime.rollout.engine_actor import COLOCATED_FRACTION, actor_options, engine_command, engine_seed
from rljob_runtime.rollout.hf_server import build_parser
from rljob_runtime.rollout.router import router_command


def test_hf_engine_command_parses_with_the_hf_server_parser() -> None:
    cmd = engine_command(
        "hf", model_path="/m", host="10.0.0.1", port=31000, dtype="float32", seed=3, threads=1
    )
    assert cmd[:3] == [sys.executable, "-m", "rljob_runtime.rollout.hf_server"]
    args = build_parser().parse_args(cmd[3:])
    assert (args.model_path, args.host, args.port, args.seed, args.threads) == ("/m", "10.0.0.1", 31000, 3, 1)
    assert (args.dtype, args.device) == ("float32", "cpu")
    assert args.max_batch_size == 64  # the server's default


def test_hf_engine_command_carries_the_tokenizer_and_trust_remote_code() -> None:
    plain = build_parser().parse_args(engine_command("hf", model_path="/m", host="h", port=1)[3:])
    assert (plain.tokenizer_path, plain.trust_remote_code) == (None, False)
    cmd = engine_command("hf", model_path="/m", host="h", port=1, tokenizer_path="/t", trust_remote_code=True)
    args = build_parser().parse_args(cmd[3:])
    assert (args.tokenizer_path, args.trust_remote_code) == ("/t", True)


def test_sglang_engine_command_carries_the_tokenizer_and_trust_remote_code() -> None:
    plain = engine_command("sglang", model_path="/m", host="h", port=1)
    assert "--tokenizer-path" not in plain and "--trust-remote-code" not in plain
    cmd = engine_command(
        "sglang", model_path="/m", host="h", port=1, tokenizer_path="/t", trust_remote_code=True
    )
    assert cmd[cmd.index("--tokenizer-path") + 1] == "/t"
    assert cmd[cmd.index("--trust-remote-code") + 1].startswith("--"), "a bare flag"


def test_engines_are_seeded_from_training_seed_by_index_and_launch() -> None:
    seeds = [engine_seed(42, index) for index in range(3)]
    assert seeds == [42, 43, 44]
    assert engine_seed(42, 0, launch=2) == 1042  # a relaunch does not repeat the first launch's samples
    assert engine_seed(2**31 - 1, 1) == 0  # within SGLang's and torch's seed range


def test_hf_engine_takes_sglangs_max_running_requests_as_its_batch_size() -> None:
    cmd = engine_command(
        "hf",
        model_path="/m",
        host="h",
        port=1,
        sglang_args={"max-running-requests": "2", "mem-fraction-static": "0.5"},
    )
    assert build_parser().parse_args(cmd[3:]).max_batch_size == 2


def test_sglang_engine_command_uses_launch_flags_and_extra_args() -> None:
    cmd = engine_command(
        "sglang",
        model_path="/m",
        host="h",
        port=1,
        dtype="bfloat16",
        seed=2,
        tp_size=2,
        base_gpu_id=4,
        enable_memory_saver=True,
        sglang_args={"mem-fraction-static": "0.7", "enable_metrics": ""},
    )
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    flags = [a[2:] for a in cmd[3:] if a.startswith("--")]
    assert set(flags) - {"enable-metrics"} <= engine_api.LAUNCH_FLAGS
    text = " ".join(cmd)
    for part in ("--tp-size 2", "--base-gpu-id 4", "--mem-fraction-static 0.7", "--dtype bfloat16"):
        assert part in text
    assert "--random-seed 2" in text and "--enable-memory-saver" in text
    assert cmd[cmd.index("--enable-metrics") + 1].startswith("--"), "an empty value is a bare flag"


def test_router_command_disables_its_own_health_checks_breaker_and_retries() -> None:
    cmd = router_command(host="127.0.0.1", port=30001, metrics_port=30002, policy="round_robin")
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    args = parse_router_args(cmd[3:])  # the router's own parser accepts every flag
    assert (args.port, args.prometheus_port, args.policy) == (30001, 30002, "round_robin")
    assert args.disable_health_check and args.disable_circuit_breaker and args.disable_retries
    with pytest.raises(ValueError, match="router policy 'nope'"):
        router_command(host="h", port=1, metrics_port=2, policy="nope")


class _Slot:
    def options(self, fraction: float = 1.0) -> dict[str, object]:
        return {"num_cpus": fraction, "scheduling_strategy": "pg"}


def test_actor_options_share_the_bundle_when_colocated() -> None:
    colocated = actor_options(_Slot(), colocated=True, device="cpu")
    assert colocated["num_cpus"] == COLOCATED_FRACTION and "num_gpus" not in colocated
    assert colocated["max_concurrency"] > 1, "alive()/kill() must answer while start() waits"
    assert actor_options(_Slot(), colocated=False, device="cpu")["num_cpus"] == 1.0
    gpu = actor_options(_Slot(), colocated=True, device="cuda")
    assert gpu["num_gpus"] == COLOCATED_FRACTION
    assert gpu["runtime_env"]["env_vars"]["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_kill_group_takes_grandchildren(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = f"import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); open({str(pid_file)!r},'w').write(str(p.pid)); time.sleep(60)"
    proc = procs.spawn([sys.executable, "-c", script], log_path=tmp_path / "log")
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    procs.kill_group(proc)
    assert proc.returncode is not None
    assert _wait_gone(grandchild)
    procs.kill_group(proc)  # idempotent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_child_dies_with_a_hard_killed_parent(tmp_path: Path) -> None:
    """What protects us from ray.kill (SIGKILL) of an engine actor: the server dies with it."""
    pid_file = tmp_path / "child.pid"
    parent = (
        "import sys,time; from pathlib import Path; from rljob_runtime.rollout import procs; "
        f"p=procs.spawn([sys.executable,'-c','import time; time.sleep(60)'], log_path=Path({str(tmp_path / 'log')!r})); "
        f"open({str(pid_file)!r},'w').write(str(p.pid)); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        proc.kill()
        proc.wait()
        assert _wait_gone(child), "the child outlived its SIGKILLed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert procs.log_tail(None) == ""


@pytest.mark.parametrize(
    ("ids", "visible", "expected"),
    [
        ([], None, 0),
        ([3], None, 3),  # the node shows every GPU: Ray's id is the index
        (["3"], "0,1,2,3", 3),
        (["5"], "4,5", 1),  # the node restricts devices: the id's place in the list the server sees
        ([7], "1,2", 7),  # not in the list (Ray and the environment disagree): the id as it is
    ],
)
def test_base_gpu_id_is_the_index_among_the_devices_the_server_sees(
    ids: list[object], visible: str | None, expected: int
) -> None:
    from rljob_runtime.rollout.engine_actor import base_gpu_id

    assert base_gpu_id(ids, visible) == expected


def test_memory_saver_gets_torchs_cuda_runtime_on_the_loader_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_runtime.rollout import engine_actor

    monkeypatch.setattr(engine_actor, "cudart_dir", lambda: "/torch/nvidia/cu13/lib")
    assert engine_actor.with_cudart_dir("") == "/torch/nvidia/cu13/lib"
    assert engine_actor.with_cudart_dir("/a:/b") == "/torch/nvidia/cu13/lib:/a:/b"
    assert engine_actor.with_cudart_dir("/torch/nvidia/cu13/lib:/a") == "/torch/nvidia/cu13/lib:/a"
    monkeypatch.setattr(engine_actor, "cudart_dir", lambda: None)
    assert engine_actor.with_cudart_dir("/a") == "/a"


def test_an_engine_that_exits_while_starting_says_why_in_a_line(tmp_path: Path) -> None:
    """The start failure carries the end of the server's log (where the error is), short enough for
    the job's status line."""
    from rljob_runtime.rollout.engine_actor import EngineProcess, EngineStartError

    engine = EngineProcess(kind="hf", model_path=str(tmp_path / "no-such-model"), log_dir=str(tmp_path))
    try:
        with pytest.raises(EngineStartError) as info:
            engine.start()
    finally:
        engine.shutdown()
    message = str(info.value)
    assert message.startswith("engine 0 (hf) exited with code ") and "no-such-model" in message
    assert "its log ends:" in message and len(" ".join(message.split())) < 1000


def test_trainer_ranks_use_sglangs_nccl_cumem_setting() -> None:
    """Both ends of the weight-update group must agree on NCCL's cuMem use: SGLang sets 0 unless the
    environment sets it (an H200 run failed the first receive with 'invalid argument' otherwise)."""
    from rljob_runtime.trainer.torch_backend import actor_env

    assert actor_env({})["NCCL_CUMEM_ENABLE"] == "0"
    assert actor_env({"NCCL_CUMEM_ENABLE": "1"})["NCCL_CUMEM_ENABLE"] == "1"


def test_the_engine_clients_session_has_no_connection_cap() -> None:
    """aiohttp caps a session at 100 connections by default: a rollout of 256 requests reached SGLang
    100 at a time (0.61 of stock SGLang's throughput on an H200); the client's concurrency bounds them."""
    import asyncio

    from rljob_runtime.rollout.client import EngineClient

    async def limit() -> int:
        client = EngineClient.__new__(EngineClient)
        client._session = None
        session = await client.http()
        try:
            return session.connector.limit  # type: ignore[union-attr]
        finally:
            await session.close()

    assert asyncio.run(limit()) == 0
