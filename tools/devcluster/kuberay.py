"""KubeRay's ray-operator, run out of cluster.

In an all-kwok cluster the Ray heads are not real: KubeRay runs with HTTP_PROXY pointing at the
dashboard proxy, which sends its dashboard calls to the local Ray. In a cluster with a real node the
heads are real pods: KubeRay resolves `<cluster>-head-svc.<ns>.svc.cluster.local` through the
cluster's CoreDNS (a resolv.conf bind-mounted over /etc/resolv.conf in a mount namespace of its own,
so the host's is never touched) and dials the head's Service, which kube-proxy routes to the pod.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from build import gomod_versions
from common import LOOPBACK, log
from procs import free_ports, http_get, spawn, wait_for
from realnode_config import DNS_SERVICE_IP
from state import Ctx, save_state


def cluster_dns_command(cmd: list[str], resolv_conf: Path) -> list[str]:
    """`cmd` in a private mount namespace whose /etc/resolv.conf is `resolv_conf` (pure)."""
    inner = f"mount --bind {shlex.quote(str(resolv_conf))} /etc/resolv.conf && exec {shlex.join(cmd)}"
    return ["unshare", "-m", "--propagation", "private", "--fork", "--kill-child", "sh", "-c", inner]


def start_operator(ctx: Ctx, state: dict[str, Any]) -> None:
    metrics, probe = free_ports(2)
    logfile = ctx.logs / "ray-operator.log"
    env = ctx.env()
    cmd = [
        str(ctx.bins["ray-operator"]),
        "--enable-leader-election=false",
        f"--metrics-addr={LOOPBACK}:{metrics}",
        f"--health-probe-bind-address={LOOPBACK}:{probe}",
        "--log-stdout-encoder=console",
    ]
    real_node = state.get("real_node")
    if real_node:
        resolv = ctx.dir / "kuberay-resolv.conf"
        resolv.write_text(f"# the cluster's CoreDNS (kube-dns Service)\nnameserver {DNS_SERVICE_IP}\n")
        cmd = cluster_dns_command(cmd, resolv)
        route = f"the heads' Services through CoreDNS {DNS_SERVICE_IP}"
    else:
        proxy = state["proxy"]["url"]
        for k in ("HTTP_PROXY", "http_proxy"):
            env[k] = proxy
        for k in ("NO_PROXY", "no_proxy"):
            env[k] = "127.0.0.1,localhost,::1"
        route = f"HTTP_PROXY={proxy}"
    proc = spawn(cmd, logfile, env)
    state["operator"] = {
        "pid": proc.pid,
        "version": gomod_versions()["kuberay"],
        "metrics": f"http://{LOOPBACK}:{metrics}",
        "health": f"http://{LOOPBACK}:{probe}",
        "log": str(logfile),
        "route": route,
    }
    save_state(ctx, state)
    wait_for(
        "ray-operator",
        lambda: http_get(f"http://{LOOPBACK}:{probe}/readyz")[0] == 200,
        90,
        logfile,
        proc,
    )
    log(f"KubeRay ray-operator {gomod_versions()['kuberay']} running (pid {proc.pid}, {route})")
