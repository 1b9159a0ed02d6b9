"""The chart as an admin installs it, and the operator run with the chart's identity.

The Deployment the chart makes runs under kwok (its pod is admitted and scheduled, but no
container runs), so the operator itself runs as a local process with what that pod would have:
the ServiceAccount's token (TokenRequest API) and the Deployment's own arguments.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from chart_render import helm_binary

# Flags the test's OperatorProcess sets itself (local ports, a short resync).
LOCAL_FLAGS = ("--metrics-port", "--liveness", "--resync-seconds")


def helm(cluster: Any, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm_binary()), f"--kubeconfig={cluster.kubeconfig}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=cluster.env())
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


def token_kubeconfig(cluster: Any, account: str, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, as its pod's projected token would."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    config = json.loads(cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
    config["users"] = [{"name": account, "user": {"token": token}}]
    cluster_name = config["clusters"][0]["name"]
    config["contexts"] = [{"name": account, "context": {"cluster": cluster_name, "user": account}}]
    config["current-context"] = account
    path.write_text(json.dumps(config))
    return path


def deployment_args(cluster: Any, namespace: str, name: str) -> tuple[str, ...]:
    """The operator container's arguments in the installed Deployment, minus the local-only flags."""
    deploy = json.loads(cluster.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout)
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return tuple(a for a in container.get("args", []) if not a.startswith(LOCAL_FLAGS))
