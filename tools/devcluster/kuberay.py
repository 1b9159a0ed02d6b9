"""KubeRay's ray-operator, run out of cluster with HTTP_PROXY pointing at the dashboard proxy."""

from __future__ import annotations

from typing import Any

from build import gomod_versions
from common import LOOPBACK, log
from procs import free_ports, http_get, spawn, wait_for
from state import Ctx, save_state


def start_operator(ctx: Ctx, state: dict[str, Any]) -> None:
    metrics, probe = free_ports(2)
    logfile = ctx.logs / "ray-operator.log"
    env = ctx.env()
    proxy = state["proxy"]["url"]
    for k in ("HTTP_PROXY", "http_proxy"):
        env[k] = proxy
    for k in ("NO_PROXY", "no_proxy"):
        env[k] = "127.0.0.1,localhost,::1"
    cmd = [
        str(ctx.bins["ray-operator"]),
        "--enable-leader-election=false",
        f"--metrics-addr={LOOPBACK}:{metrics}",
        f"--health-probe-bind-address={LOOPBACK}:{probe}",
        "--log-stdout-encoder=console",
    ]
    proc = spawn(cmd, logfile, env)
    state["operator"] = {
        "pid": proc.pid,
        "version": gomod_versions()["kuberay"],
        "metrics": f"http://{LOOPBACK}:{metrics}",
        "health": f"http://{LOOPBACK}:{probe}",
        "log": str(logfile),
    }
    save_state(ctx, state)
    wait_for(
        "ray-operator",
        lambda: http_get(f"http://{LOOPBACK}:{probe}/readyz")[0] == 200,
        90,
        logfile,
        proc,
    )
    log(f"KubeRay ray-operator {gomod_versions()['kuberay']} running (pid {proc.pid}, HTTP_PROXY={proxy})")
