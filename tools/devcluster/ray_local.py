"""The local Ray head (CPU) and the dashboard proxy (dashproxy.py) that KubeRay reaches it through."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from common import HERE, LOOPBACK, RAY_DASHBOARD_PORT_IN_CLUSTER, HarnessError, log
from procs import free_port, free_ports, http_get, http_json, spawn, wait_for
from state import Ctx, save_state

# The demo trainer hands its weights (SmolLM2-135M in fp32: 538 MB) to the engines through the object
# store at every sync. An object that does not fit is written to disk instead ("fallback
# allocation"), and Ray refuses that once the disk is over local_fs_capacity_threshold.
OBJECT_STORE_BYTES = 1 << 30
# Ray's threshold (default 0.95) counts utilisation as 1 - free/size: on a 250 GB disk it refuses
# with 12 GB still free. This Ray shares a developer's (or CI's) disk; refuse only when it is
# really full.
LOCAL_FS_CAPACITY_THRESHOLD = "0.99"


def venv_bin() -> Path:
    return Path(sys.executable).parent


# Ray's log monitor globs the session's log folder ten times a second while it holds fewer than 1000
# files, and the folder grows with every job this shared head runs: over a full e2e run it took 79 s of
# CPU (docs/BENCHMARKS.md). Nothing here reads the worker logs it forwards (drivers connect with
# log_to_driver=False; `ray job logs` reads the supervisor's file), so a scan every 5 s does.
QUIET_HEAD_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "5"}


def start_ray(ctx: Ctx, state: dict[str, Any], num_cpus: int) -> None:
    ray = venv_bin() / "ray"
    logfile = ctx.logs / "ray-head.log"
    if not ray.exists():
        raise HarnessError(
            "ray head", f"{ray} not found: install ray[default] into the venv ({sys.executable})"
        )
    gcs, dash, client, agent_grpc, agent_http, metrics, nm, om, rtenv = free_ports(9)
    temp = ctx.ray_temp
    temp.mkdir(parents=True, exist_ok=True)
    env = ctx.env()
    env["PATH"] = f"{venv_bin()}{os.pathsep}{env['PATH']}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray >= 2.5x turns on token authentication for every cluster once ~/.ray/auth_token exists
    # (any local ray.init creates it); KubeRay's dashboard client sends no token, so keep it off here.
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_local_fs_capacity_threshold"] = LOCAL_FS_CAPACITY_THRESHOLD
    # Ray starts its workers at nice 15 by default, below the control plane's processes: the training
    # (engines, trainer ranks) then waits behind the API server and the operators. Here the workers keep
    # the head's priority.
    env["RAY_worker_niceness"] = "0"
    env.update(QUIET_HEAD_ENV)
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(ray),
        "start",
        "--head",
        "--block",
        f"--node-ip-address={LOOPBACK}",
        f"--port={gcs}",
        "--include-dashboard=true",
        f"--dashboard-host={LOOPBACK}",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--dashboard-agent-listen-port={agent_http}",
        f"--metrics-export-port={metrics}",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--runtime-env-agent-port={rtenv}",
        f"--num-cpus={num_cpus}",
        # The custom resources the rljob operator's worker groups advertise (one per GPU or CPU
        # slot), so an RLTrainingJob's runtime can place its bundles on this one local node.
        "--resources="
        + json.dumps({name: num_cpus for name in ("rljob_colocated", "rljob_trainer", "rljob_rollout")}),
        "--num-gpus=0",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
    ]
    log(f"starting a local Ray head (CPU, dashboard on {LOOPBACK}:{dash})")
    proc = spawn(cmd, logfile, env)
    state["ray"] = {
        "pid": proc.pid,
        "gcs_address": f"{LOOPBACK}:{gcs}",
        "dashboard": f"http://{LOOPBACK}:{dash}",
        "dashboard_port": dash,
        "temp_dir": str(temp),
        "log": str(logfile),
    }
    save_state(ctx, state)
    base = f"http://{LOOPBACK}:{dash}"
    wait_for("ray head dashboard", lambda: http_get(base + "/api/version")[0] == 200, 180, logfile, proc)
    smoke_test_ray(base, logfile)
    log(f"Ray head ready (GCS {LOOPBACK}:{gcs}, dashboard {base}, logs under {temp})")


def smoke_test_ray(base: str, logfile: Path) -> None:
    """Submits a trivial job, so the job agent is known to be up before KubeRay needs it."""
    deadline = time.monotonic() + 120
    sub_id = f"rljob-devcluster-smoke-{int(time.time())}"
    last = ""
    while time.monotonic() < deadline:
        try:
            http_json(base + "/api/jobs/", {"entrypoint": "true", "submission_id": sub_id}, timeout=30)
            break
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
            time.sleep(1)
    else:
        raise HarnessError("ray job smoke test", f"cannot submit a job: {last}", logfile)
    while time.monotonic() < deadline:
        info = http_json(f"{base}/api/jobs/{sub_id}")
        if info.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
            if info["status"] != "SUCCEEDED":
                raise HarnessError(
                    "ray job smoke test", f"trivial job ended {info['status']}: {info}", logfile
                )
            with contextlib.suppress(OSError, urllib.error.URLError):
                req = urllib.request.Request(f"{base}/api/jobs/{sub_id}", method="DELETE")
                urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10).close()
            return
        time.sleep(0.5)
    raise HarnessError("ray job smoke test", "trivial job did not finish in 120 s", logfile)


def start_proxy(ctx: Ctx, state: dict[str, Any]) -> None:
    port = free_port()
    logfile = ctx.logs / "dashproxy.log"
    dash = state["ray"]["dashboard_port"]
    cmd = [sys.executable, str(HERE / "dashproxy.py"), f"--listen-port={port}", f"--target-port={dash}"]
    proc = spawn(cmd, logfile, ctx.env())
    url = f"http://{LOOPBACK}:{port}"
    state["proxy"] = {"pid": proc.pid, "url": url, "port": port, "log": str(logfile)}
    save_state(ctx, state)
    probe = f"http://probe-head-svc.default.svc.cluster.local:{RAY_DASHBOARD_PORT_IN_CLUSTER}/api/version"
    wait_for("dashboard proxy", lambda: http_get(probe, proxy=url)[0] == 200, 30, logfile, proc)
    log(f"dashboard proxy ready at {url}: *:{RAY_DASHBOARD_PORT_IN_CLUSTER} -> {LOOPBACK}:{dash}")


def start_prestop(ctx: Ctx, state: dict[str, Any]) -> None:
    """prestop.py: the head pods' preStop hook for the stand-in pods (a suspended RayJob's driver
    gets SIGTERM, as in a real cluster)."""
    logfile = ctx.logs / "prestop.log"
    cmd = [sys.executable, str(HERE / "prestop.py"), f"--kubeconfig={ctx.kubeconfig}"]
    proc = spawn(cmd, logfile, ctx.env())
    state["prestop"] = {"pid": proc.pid, "log": str(logfile)}
    save_state(ctx, state)
    wait_for("preStop stand-in", lambda: "watching RayJobs" in logfile.read_text(), 30, logfile, proc)
    log("preStop stand-in watching RayJobs (a suspended one's driver gets SIGTERM)")
