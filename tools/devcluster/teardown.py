"""Teardown: stops everything a cluster started and keeps its logs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from common import MARKER_ENV, cache_root, log
from procs import cmdline, pid_alive, pids_matching, pids_with_env, stop_pid
from state import Ctx


def teardown(ctx: Ctx, state: dict[str, Any]) -> Path | None:
    """Stops everything of this cluster; keeps its logs in ${RLJOB_CACHE}/logs/<name>-last."""
    marker_ray = state.get("ray", {}).get("temp_dir") or str(ctx.ray_temp)
    if state.get("real_node"):
        from realnode import stop_real_node  # first: its pods' containers outlive the control plane

        stop_real_node(ctx, state)
    # `ray start --block` drains for up to 30 s on SIGTERM; nothing needs draining here.
    for key, what, marker, grace in (
        ("kueue", "kueue", "kueue", 15.0),
        ("operator", "ray-operator", "ray-operator", 15.0),
        ("proxy", "dashboard proxy", "dashproxy.py", 15.0),
        ("prestop", "preStop stand-in", "prestop.py", 5.0),
        ("ray", "ray head", "ray", 3.0),
    ):
        pid = state.get(key, {}).get("pid")
        if pid:
            t = time.monotonic()
            stop_pid(int(pid), marker, what, grace)
            log(f"stopped {what} (pid {pid}) in {time.monotonic() - t:.1f} s")
    # Ray daemons (gcs_server, raylet, dashboard, workers) mention our temp dir on their command lines.
    for pid in pids_matching(marker_ray):
        stop_pid(pid, marker_ray, "ray process", grace=5)
    saved = save_logs(ctx)
    if ctx.kwok_cluster_dir.exists():
        t = time.monotonic()
        delete_control_plane(ctx)
        log(f"stopped the control plane (kwokctl delete cluster) in {time.monotonic() - t:.1f} s")
    # Anything left that we started: command lines name the cluster dir, environments carry MARKER_ENV.
    for pid in pids_matching(str(ctx.dir) + "/"):
        stop_pid(pid, str(ctx.dir) + "/", "leftover process", grace=5)
    for pid in pids_with_env(MARKER_ENV, str(ctx.dir)):
        if pid_alive(pid):
            log(f"stopping leftover process {pid}: {cmdline(pid)[:80]}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if ctx.dir.exists():
        shutil.rmtree(ctx.dir, ignore_errors=True)
    if Path(marker_ray).exists() and not marker_ray.startswith(str(ctx.dir)):
        shutil.rmtree(marker_ray, ignore_errors=True)
    return saved


def delete_control_plane(ctx: Ctx) -> None:
    """`kwokctl delete cluster`: stops etcd, the API server, the controllers, kwok; removes their dir."""
    kwokctl = ctx.bins.get("kwokctl")
    if kwokctl and Path(kwokctl).exists():
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [str(kwokctl), "delete", "cluster", f"--name={ctx.name}", f"--kubeconfig={ctx.kubeconfig}"],
                env=ctx.env(),
                capture_output=True,
                timeout=120,
                cwd=ctx.dir,
            )


def save_logs(ctx: Ctx) -> Path | None:
    """Copies this cluster's logs to ${RLJOB_CACHE}/logs/<name>-last (kwokctl delete removes its own)."""
    if not ctx.dir.exists():
        return None
    saved = cache_root() / "logs" / f"{ctx.name}-last"
    if saved.exists():
        shutil.rmtree(saved, ignore_errors=True)
    saved.mkdir(parents=True, exist_ok=True)
    for src, name in ((ctx.logs, "devcluster"), (ctx.kwok_cluster_dir / "logs", "control-plane")):
        if src.is_dir():
            shutil.copytree(src, saved / name, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    return saved
