"""One rollout engine: a Ray actor on the engine's first placement bundle that owns the server process.

The server is a child process of the actor (``hf``: ``python -m rljob_runtime.rollout.hf_server``;
``sglang``: ``python -m sglang.launch_server``) on a free port of the actor's node. The actor only
launches, watches and kills it; requests go straight to the server's URL (through the router).

The child never outlives the actor: it has its own process group (killed as a whole) and
``PR_SET_PDEATHSIG`` (see ``procs``), and ``shutdown`` or a finalizer (GC, interpreter exit) kills it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import ray

from rljob_api.support import HF_SGLANG_ARGS

from .. import engine_api
from ..cpu_threads import threads_for
from ..models.resolve import model_on_this_node, tokenizer_on_this_node
from ..net import free_port
from . import procs

EngineKind = Literal["hf", "sglang"]

# Colocated engines share their bundle with a trainer rank: take a fifth of it (slime does the same).
COLOCATED_FRACTION = 0.2


class EngineStartError(RuntimeError):
    """The engine server exited or never became healthy; the message ends with its log."""


def engine_command(
    kind: EngineKind,
    *,
    model_path: str,
    host: str,
    port: int,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    threads: int | None = None,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    enable_memory_saver: bool = False,
    sglang_args: Mapping[str, str] | None = None,
    tokenizer_path: str | None = None,
    trust_remote_code: bool = False,
    return_routed_experts: bool = False,
) -> list[str]:
    """The server's command line (pure, so the SGLang flags can be checked without SGLang).
    ``tokenizer_path``: model.tokenizer as this node sees it (None: the model's own)."""
    if kind == "hf":
        cmd = [sys.executable, "-m", "rljob_runtime.rollout.hf_server", "--model-path", model_path]
        if tokenizer_path:
            cmd += ["--tokenizer-path", tokenizer_path]
        if trust_remote_code:
            cmd += ["--trust-remote-code"]
        # The server sees every GPU of the node (like SGLang): its own is the bundle's, base_gpu_id.
        where = f"cuda:{base_gpu_id}" if device == "cuda" else device
        cmd += ["--host", host, "--port", str(port), "--dtype", dtype, "--device", where]
        cmd += ["--seed", str(seed)]
        if threads:
            cmd += ["--threads", str(threads)]
        # SGLang's cap on requests decoded together is the hf server's batch size.
        for key in HF_SGLANG_ARGS:
            if (sglang_args or {}).get(key):
                cmd += ["--max-batch-size", str((sglang_args or {})[key])]
        return cmd
    # rollout.sglangArgs: an empty value means a bare flag
    extra: dict[str, Any] = {
        key: (True if value == "" else value) for key, value in (sglang_args or {}).items()
    }
    extra.setdefault("dtype", dtype)
    extra.setdefault("random-seed", seed)
    args = engine_api.sglang_launch_args(
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        trust_remote_code=trust_remote_code,
        host=host,
        port=port,
        tp_size=tp_size,
        base_gpu_id=base_gpu_id,
        enable_memory_saver=enable_memory_saver,
        enable_return_routed_experts=return_routed_experts,
        extra=extra,
    )
    return [sys.executable, "-m", "sglang.launch_server", *args]


SEED_MODULUS = 2**31  # SGLang's --random-seed and torch's manual_seed both take it


def engine_seed(training_seed: int, index: int, launch: int = 1) -> int:
    """The sampling seed of engine ``index`` at its ``launch``-th start: training.seed plus the index,
    so engines differ and a job reproduces; a relaunch moves 1000 on, so it does not repeat old samples."""
    return (training_seed + index + 1000 * (launch - 1)) % SEED_MODULUS


def base_gpu_id(ray_gpu_ids: list[Any], visible: str | None) -> int:
    """SGLang's ``--base-gpu-id``: the bundle's GPU as an index into the devices the server sees.
    Ray names GPUs by their ids in the node's CUDA_VISIBLE_DEVICES (when the node restricts it, the
    server inherits that list, so the id's position in it is the index); otherwise id = index."""
    if not ray_gpu_ids:
        return 0
    gpu = str(ray_gpu_ids[0])
    listed = [d.strip() for d in visible.split(",")] if visible else []
    if listed and gpu in listed:
        return listed.index(gpu)
    return int(gpu)


def with_cudart_dir(ld_library_path: str) -> str:
    """``ld_library_path`` with the directory of torch's CUDA runtime library first (if found)."""
    found = cudart_dir()
    if found is None or found in ld_library_path.split(":"):
        return ld_library_path
    return f"{found}:{ld_library_path}" if ld_library_path else found


def cudart_dir() -> str | None:
    """Where torch's libcudart.so.* lies: the nvidia runtime wheel's lib directory (cu12 or cu13
    layout), or torch/lib."""
    import importlib.util

    roots: list[Path] = []
    for package in ("nvidia", "torch"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(Path(p) for p in spec.submodule_search_locations)
    for root in roots:
        for candidate in sorted(root.glob("**/lib/libcudart.so*")):
            return str(candidate.parent)
    return None


def actor_options(slot: Any, *, colocated: bool, device: str) -> dict[str, Any]:
    """Ray options that pin an ``EngineActor`` to ``slot`` (a ``placement.Slot``)."""
    fraction = COLOCATED_FRACTION if colocated else 1.0
    options: dict[str, Any] = {**slot.options(fraction), "max_restarts": 0, "max_concurrency": 4}
    if device == "cuda":
        # Like slime: a share of the bundle's GPU tells us its index; SGLang must see every GPU of
        # the node to place a multi-GPU engine from base_gpu_id on.
        options["num_gpus"] = COLOCATED_FRACTION
        options["runtime_env"] = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    return options


def _http_status(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError):
        return -1


def _kill_held(holder: list[subprocess.Popen[bytes] | None]) -> None:
    procs.kill_group(holder[0])


class EngineProcess:
    """Launches, watches and kills one engine server (usable without Ray; ``EngineActor`` wraps it)."""

    def __init__(
        self,
        *,
        kind: EngineKind,
        model_path: str,
        index: int = 0,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        threads: int | None = None,
        cpu_share: int = 1,
        tp_size: int = 1,
        enable_memory_saver: bool = False,
        sglang_args: Mapping[str, str] | None = None,
        host: str | None = None,
        log_dir: str | None = None,
        startup_timeout_s: float = 600.0,
        model_reference: str | None = None,
        tokenizer_path: str | None = None,
        tokenizer_reference: str | None = None,
        trust_remote_code: bool = False,
        return_routed_experts: bool = False,
    ) -> None:
        """``model_reference``: spec.model.path, resolved again on this node when ``model_path`` (the
        driver's resolution) is not visible here; ``tokenizer_reference`` and ``tokenizer_path`` the
        same for model.tokenizer (both None: the model's own tokenizer). ``threads``: the server's
        torch threads on cpu; None: its part of this node's cores, shared by ``cpu_share`` processes
        (``placement.Slot.share``)."""
        self.kind: EngineKind = kind
        self.model_path = model_on_this_node(model_reference, model_path) if model_reference else model_path
        self.tokenizer_path = (
            tokenizer_on_this_node(tokenizer_reference, tokenizer_path or "")
            if tokenizer_reference
            else tokenizer_path
        )
        self.trust_remote_code = trust_remote_code
        self.return_routed_experts = return_routed_experts  # training.routingReplay (SGLang only)
        self.index = index
        self.dtype = dtype
        self.device = device
        self.seed = seed
        if threads is None and device == "cpu":
            threads = threads_for(cpu_share)
        self.threads = threads
        self.tp_size = tp_size
        self.enable_memory_saver = enable_memory_saver
        self.sglang_args = dict(sglang_args or {})
        self.host = host or self._node_ip()
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="rljob-engines-"))
        self.startup_timeout_s = startup_timeout_s
        self.launches = 0
        self.command: list[str] = []  # the last launch's command line
        # one-element holder, so the finalizer (GC and interpreter exit) sees the current process
        self._procs: list[subprocess.Popen[bytes] | None] = [None]
        self._url: str | None = None
        self._log: Path | None = None
        self._lock = threading.Lock()
        # PDEATHSIG follows the forking thread: fork from one thread that lives as long as we do.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine{index}-spawn")
        weakref.finalize(self, _kill_held, self._procs)

    @staticmethod
    def _node_ip() -> str:
        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
        return "127.0.0.1"

    def _base_gpu_id(self) -> int:
        if self.device != "cuda" or not ray.is_initialized():
            return 0
        return base_gpu_id(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))

    def _command(self, model_path: str, port: int) -> list[str]:
        return engine_command(
            self.kind,
            model_path=model_path,
            host=self.host,
            port=port,
            dtype=self.dtype,
            device=self.device,
            seed=engine_seed(self.seed, 0, self.launches),
            threads=self.threads,
            tp_size=self.tp_size,
            base_gpu_id=self._base_gpu_id(),
            enable_memory_saver=self.enable_memory_saver,
            sglang_args=self.sglang_args,
            tokenizer_path=self.tokenizer_path,
            trust_remote_code=self.trust_remote_code,
            return_routed_experts=self.return_routed_experts,
        )

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.kind == "sglang" and self.enable_memory_saver:
            # torch_memory_saver's LD_PRELOAD hook needs torch's libcudart on the loader path at exec
            # time; without it SGLang's scheduler exits with 127 (benchmarks/gpu/host/README.md)
            env["LD_LIBRARY_PATH"] = with_cudart_dir(env.get("LD_LIBRARY_PATH", ""))
        if self.device == "cpu":
            # active OpenMP waiting collapses on shared cores (docs/runtime-env.md); must precede torch
            env["OMP_WAIT_POLICY"] = "PASSIVE"
            if self.threads:
                env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def _launch_once(self, model_path: str, port: int) -> None:
        self.launches += 1
        self._log = self.log_dir / f"engine{self.index}-{self.launches}.log"
        cmd = self.command = self._command(model_path, port)
        env = self._env()
        self._proc = self._spawner.submit(procs.spawn, cmd, log_path=self._log, env=env).result()
        self._url = f"http://{self.host}:{port}"

    def _wait_healthy(self, deadline: float) -> str:
        """Until the server launched by ``_launch_once`` is healthy; its URL."""
        assert self._proc is not None and self._url is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineStartError(
                    self._failure(f"exited with code {self._proc.returncode} while starting")
                )
            if _http_status(f"{self._url}/health_generate", timeout=30) == 200:
                return self._url
            time.sleep(0.5)
        raise EngineStartError(self._failure(f"was not healthy after {self.startup_timeout_s:.0f} s"))

    def _failure(self, what: str) -> str:
        """Short enough for the job's status (the operator shows the runtime's last line, 1000
        characters): what happened, the log's path, then the end of the log, where the error is."""
        return f"engine {self.index} ({self.kind}) {what} (log {self._log}); its log ends: {procs.log_tail(self._log, 700)}"

    def start(self, model_path: str | None = None) -> str:
        """Launch the server (if not running) and wait until /health_generate answers 200; its URL."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._url is not None:
                return self._url
            path = model_path or self.model_path
            deadline = time.monotonic() + self.startup_timeout_s
            for attempt in range(3):
                self._launch_once(path, free_port(self.host))
                try:
                    return self._wait_healthy(deadline)
                except EngineStartError as err:
                    procs.kill_group(self._proc)
                    # another process took the port between free_port() and bind: try another one
                    if "address already in use" not in str(err).lower() or attempt == 2:
                        self._url = None
                        raise
            raise AssertionError("unreachable")

    @property
    def _proc(self) -> subprocess.Popen[bytes] | None:
        return self._procs[0]

    @_proc.setter
    def _proc(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._procs[0] = proc

    def url(self) -> str | None:
        return self._url

    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        """The server process is running (not: healthy; the manager's health check says that)."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """Hard kill of the server and its process group (SIGKILL, no grace): a dead engine's fate."""
        procs.kill_group(self._proc)

    def restart(self, model_path: str | None = None) -> str:
        """Kill the server and start a new one (new port); the new URL once healthy."""
        with self._lock:
            procs.kill_group(self._proc)
            self._proc = None
            self._url = None
        return self.start(model_path)

    def shutdown(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); idempotent."""
        procs.kill_group(self._proc, grace_s=5.0)
        self._spawner.shutdown(wait=False)

    def info(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "url": self._url,
            "pid": self.pid(),
            "alive": self.alive(),
            "launches": self.launches,
            "log": str(self._log) if self._log else None,
        }

    def log_tail(self, chars: int = 3000) -> str:
        return procs.log_tail(self._log, chars)

    def gpu_memory_gb(self) -> float:
        """GPU memory held by the server's processes (its process group), from NVML; -1 if unknown
        (no NVML, or PIDs NVML cannot see, as in some containers)."""
        if self.device != "cuda" or self._proc is None or self._proc.poll() is not None:
            return 0.0
        return procs.group_gpu_memory_gb(self._proc.pid)

    def __repr__(self) -> str:
        return f"EngineProcess({json.dumps(self.info())})"


# The Ray actor: threaded so alive()/kill() answer while start() waits for a slow engine.
EngineActor = ray.remote(EngineProcess)
