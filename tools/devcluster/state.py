"""Cluster context (paths, environment, kubectl), the state file and component health."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from build import binaries
from common import MARKER_ENV, RAY_DASHBOARD_PORT_IN_CLUSTER, HarnessError, cluster_dir
from procs import http_get


@dataclasses.dataclass
class Ctx:
    name: str
    dir: Path
    bins: dict[str, Path]

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def kwok_workdir(self) -> Path:
        return self.dir / "kwok"

    @property
    def kwok_cluster_dir(self) -> Path:
        return self.kwok_workdir / "clusters" / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def ray_temp(self) -> Path:
        # Ray puts unix sockets about 64 characters below its temp dir (session_<date>/sockets/...),
        # and AF_UNIX paths are limited to 107 bytes: keep the dir short.
        p = self.dir / "ray"
        if len(str(p)) > 40:
            p = Path(tempfile.gettempdir()) / f"rljob-ray-{os.getuid()}-{self.name}"
        return p

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Every process we start (and its descendants: Ray workers, kwokctl's components) carries
        # this, so `down` finds stragglers by it.
        env[MARKER_ENV] = str(self.dir)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["KWOK_WORKDIR"] = str(self.kwok_workdir)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        return env

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bins["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, env=self.env()
        )
        if check and proc.returncode != 0:
            raise HarnessError("kubectl " + " ".join(args[:3]), proc.stderr.strip() or proc.stdout.strip())
        return proc


def make_ctx(name: str, bins: dict[str, Path] | None = None) -> Ctx:
    if bins is None:
        bins = {b.name: b.path for b in binaries()}
    return Ctx(name=name, dir=cluster_dir(name), bins=bins)


def load_state(ctx: Ctx) -> dict[str, Any] | None:
    try:
        return json.loads(ctx.state_file.read_text())
    except (OSError, ValueError):
        return None


def save_state(ctx: Ctx, state: dict[str, Any]) -> None:
    tmp = ctx.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(ctx.state_file)


def health(ctx: Ctx, state: dict[str, Any] | None) -> dict[str, str]:
    """Component -> "ok" or a reason."""
    if state is None:
        return {"state": f"no state file {ctx.state_file}"}
    out: dict[str, str] = {}
    if "apiserver" in state and ctx.kubeconfig.exists():
        try:
            proc = ctx.kubectl("get", "--raw=/readyz", check=False, timeout=10)
            out["kube-apiserver"] = "ok" if proc.returncode == 0 else (proc.stderr.strip() or "not ready")
        except subprocess.TimeoutExpired:
            out["kube-apiserver"] = "timeout"
    else:
        out["kube-apiserver"] = "not started"
    ray = state.get("ray")
    out["ray head"] = (
        "ok" if ray and http_get(ray["dashboard"] + "/api/version")[0] == 200 else "not answering"
    )
    px = state.get("proxy")
    probe = f"http://h-head-svc.default.svc.cluster.local:{RAY_DASHBOARD_PORT_IN_CLUSTER}/api/version"
    out["dashboard proxy"] = "ok" if px and http_get(probe, proxy=px["url"])[0] == 200 else "not answering"
    node = state.get("real_node")
    if node:
        healthz = f"http://127.0.0.1:{node.get('kubelet_healthz')}/healthz"
        out["real node"] = "ok" if http_get(healthz)[0] == 200 else "kubelet not answering"
    op = state.get("operator")
    out["ray-operator"] = "ok" if op and http_get(op["health"] + "/readyz")[0] == 200 else "not answering"
    return out
