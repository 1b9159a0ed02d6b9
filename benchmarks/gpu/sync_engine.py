"""The engine side of ``weight_sync_path.py``: the model directory an hf server loads (Qwen3 config,
random bf16 safetensors, a five-word tokenizer) and the hf server itself as a subprocess, spoken to
over keep-alive HTTP as the rollout manager does."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO / "runtime", REPO / "api"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from rljob_runtime.net import free_port  # noqa: E402
from rljob_runtime.rollout import procs  # noqa: E402

Tensors = dict[str, torch.Tensor]
LOCALHOST = "127.0.0.1"
COMPLETE = ".complete"  # marks a finished model directory (reused under --model-root)


class BenchmarkError(RuntimeError):
    """The sync failed or was not bit-exact."""


def nbytes(named: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in named.values())


# -------------------------------------------------------------------------------- model directory


def write_tokenizer(dest: Path) -> None:
    """The least AutoTokenizer loads: five words (ids 0-4; pad 1, eos 2) in a fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, "hello": 3, "world": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    fast.save_pretrained(str(dest))


def write_model_dir(dest: Path, config: dict[str, Any], weights: Tensors) -> Path:
    """An HF directory the hf server loads: config.json, model.safetensors (bf16), tokenizer.
    Written beside ``dest`` and renamed, so a half-written directory is never reused."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        Qwen3Config(**config).save_pretrained(str(tmp))
        write_tokenizer(tmp)
        save_file(
            {name: t.detach().contiguous().cpu() for name, t in weights.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / COMPLETE).touch()
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def model_root(size: int) -> Path:
    """/dev/shm when it has room for ``size`` bytes and some slack, else the temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > size * 1.2 + 2**30:
        return shm
    return Path(tempfile.gettempdir())


@contextlib.contextmanager
def model_dir(model: str, config: dict[str, Any], weights: Tensors, keep_root: Path | None) -> Iterator[Path]:
    """The engine's model directory: reused and kept under ``keep_root``, else temporary."""
    root = keep_root or model_root(nbytes(weights))
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"rljob-weight-sync-{model}"
    if keep_root is None or not (dest / COMPLETE).is_file():
        write_model_dir(dest, config, weights)
    try:
        yield dest
    finally:
        if keep_root is None:
            shutil.rmtree(dest, ignore_errors=True)


# ---------------------------------------------------------------------------------------- the engine


class Http:
    """JSON over keep-alive HTTP/1.1 (as the manager's aiohttp session), one connection per thread."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in range(2):
            conn = self._connection(timeout)
            reused = conn.sock is not None
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop()
                if not reused or attempt:  # only a kept-alive connection the server closed is retried
                    raise
            except Exception:
                self._drop()
                raise
        text = raw.decode(errors="replace")
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = text.strip()
        return response.status, answer


class EngineServer:
    """``python -m rljob_runtime.rollout.hf_server`` as a subprocess; stopped on exit, always."""

    def __init__(
        self,
        model_path: Path,
        device: torch.device,
        log_path: Path,
        load_timeout: float,
        request_timeout: float,
    ) -> None:
        self.model_path, self.device, self.log_path = model_path, device, log_path
        self.load_timeout, self.request_timeout = load_timeout, request_timeout
        self.port = free_port(LOCALHOST)
        self.http = Http(LOCALHOST, self.port)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s = 0.0

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "rljob_runtime.rollout.hf_server",
            "--model-path",
            str(self.model_path),
            "--device",
            str(self.device),
            "--dtype",
            "bfloat16",
            "--host",
            LOCALHOST,
            "--port",
            str(self.port),
        ]

    def __enter__(self) -> EngineServer:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "runtime"), str(REPO / "api"), *filter(None, [env.get("PYTHONPATH")])]
        )
        started = time.perf_counter()
        # own process group, killed with this process even if it dies without cleaning up
        self.log_path.unlink(missing_ok=True)  # spawn appends: the tail shown must be this run's
        self.proc = procs.spawn(self.command(), log_path=self.log_path, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            print(f"server log {self.log_path}, last lines:\n{self.log_tail()}", flush=True)
            raise
        self.start_s = time.perf_counter() - started
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.load_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchmarkError(f"the engine server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.http.request("GET", "/health", timeout=5)[0] == 200:
                    return
            time.sleep(0.5)
        raise BenchmarkError(f"the engine server did not answer /health in {self.load_timeout:.0f} s")

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop()
        if exc is not None:
            print(f"server log {self.log_path}, last lines:\n{self.log_tail()}", flush=True)

    def stop(self) -> None:
        # SIGTERM (aiohttp exits cleanly), SIGKILL after 30 s (e.g. stuck in a collective)
        procs.kill_group(self.proc, grace_s=30)

    def log_tail(self) -> str:
        return procs.log_tail(self.log_path, chars=6000) or "(empty log)"

    def expect(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """The answer of a request that must succeed (HTTP 200 and no ``success: false``)."""
        status, answer = self.http.request(method, path, body, timeout or self.request_timeout)
        if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
            raise BenchmarkError(f"{method} {path}: HTTP {status} {str(answer)[:500]}")
        return answer

    def flush_cache(self) -> None:
        """GET /flush_cache until 200, as RolloutManager._update_engine (120 tries, 0.5 s apart)."""
        for _ in range(120):
            status, _answer = self.http.request("GET", "/flush_cache", timeout=30)
            if status == 200:
                return
            time.sleep(0.5)
        raise BenchmarkError("/flush_cache still refused after 60 s")
