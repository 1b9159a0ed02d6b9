"""Pods for the real-pod tests: small restricted pods from a built image, and a wait on their phase."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from e2e.conftest import Cluster

RELEASE = "rljob"  # the operator's helm release (conftest.operator_release)
IMAGE = "docker.io/rljob/operator:0.1.0"  # any built image with python3; the operator's is small
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
WEB = (
    "import http.server, socketserver\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'hello from a real pod')\n"
    "print('serving', flush=True)\n"
    "socketserver.TCPServer(('', 8000), H).serve_forever()\n"
)


def pod(name: str, code: str, labels: dict[str, str] | None = None, memory: str = "64Mi") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", code],
                    "ports": [{"containerPort": 8000}],
                    "resources": {"requests": {"cpu": "10m", "memory": memory}, "limits": {"memory": memory}},
                    "securityContext": RESTRICTED,
                }
            ],
        },
    }


def wait_phase(cluster: Cluster, ns: str, name: str, phases: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    obj: dict[str, Any] = {}
    while time.monotonic() < deadline:
        obj = cluster.get("pod", name, ns) or {}
        if obj.get("status", {}).get("phase") in phases:
            return obj
        time.sleep(0.5)
    pytest.fail(
        f"pod {ns}/{name} not {phases} in {timeout:.0f} s: {json.dumps(obj.get('status'))}", pytrace=False
    )


def wait_for(what: str, check: Any, timeout: float, report: Callable[[], str] | None = None) -> Any:
    """`check()`'s first true value, polled each second; the test fails after `timeout` s, with
    `report()` (what the cluster looked like then) in its message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    seen = f"\n{report()}" if report is not None else ""
    pytest.fail(f"{what}: not within {timeout:.0f} s{seen}", pytrace=False)
