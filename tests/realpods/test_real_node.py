"""The real node: pods really run beside the kwok GPU pools, and what a cluster user relies on works
on it: logs, exec, port-forward (the API server dials the kubelet with its client certificate),
cluster DNS and Service routing (CoreDNS, kube-proxy), Pod Security and resource limits."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest
from e2e.conftest import Cluster
from real_pods import WEB, pod, wait_phase

pytestmark = pytest.mark.realpods

NODE = "real-0"


def test_the_real_node_is_a_real_kubelet_and_kwok_keeps_to_its_own(real_cluster: Cluster) -> None:
    nodes = {
        n["metadata"]["name"]: n
        for n in json.loads(real_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    }
    real = nodes[NODE]
    assert real["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.36.")
    assert real["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in real["metadata"].get("annotations", {})
    kwok = [n for name, n in nodes.items() if name != NODE]
    assert kwok and all(n["metadata"]["labels"].get("rljob.dev/gpu-pool") for n in kwok), (
        "kwok keeps the GPU pools only"
    )
    assert all(n["status"]["nodeInfo"]["kubeletVersion"] == "fake" for n in kwok)


def test_a_pod_runs_with_logs_exec_and_port_forward(real_cluster: Cluster, restricted_namespace: str) -> None:
    ns = restricted_namespace
    real_cluster.apply(
        {**pod("web", WEB), "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}}}
    )
    obj = wait_phase(real_cluster, ns, "web", {"Running"})
    assert obj["spec"]["nodeName"] == NODE
    assert obj["status"]["podIP"].startswith("198.18.0.")
    deadline = time.monotonic() + 30
    while "serving" not in real_cluster.kubectl("logs", "-n", ns, "web", check=False).stdout:
        assert time.monotonic() < deadline, "no log line from the pod through the kubelet"
        time.sleep(0.5)
    whoami = real_cluster.kubectl(
        "exec", "-n", ns, "web", "--", "python3", "-c", "import os; print(os.getuid())"
    )
    assert whoami.stdout.strip() == "65532"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forward = subprocess.Popen(
        [
            str(real_cluster.kubectl_bin),
            f"--kubeconfig={real_cluster.kubeconfig}",
            "port-forward",
            "-n",
            ns,
            "pod/web",
            f"{port}:8000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        body = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=3).read()
            except OSError:
                time.sleep(0.5)
        assert body == b"hello from a real pod"
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_cluster_dns_and_service_routing_between_real_pods(
    real_cluster: Cluster, restricted_namespace: str
) -> None:
    ns = restricted_namespace
    real_cluster.apply(
        {**pod("web", WEB), "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8000}]},
        },
    )
    wait_phase(real_cluster, ns, "web", {"Running"})
    client = (
        "import socket, time, urllib.request\n"
        f"name = 'web.{ns}.svc.cluster.local'\n"
        "for _ in range(60):\n"
        "    try:\n"
        "        print(socket.gethostbyname(name), urllib.request.urlopen('http://' + name + '/', timeout=3).read().decode()); break\n"
        "    except OSError as e:\n"
        "        print('retry', e, flush=True); time.sleep(1)\n"
        "else:\n"
        "    raise SystemExit(1)\n"
    )
    real_cluster.apply({**pod("client", client), "metadata": {"name": "client", "namespace": ns}})
    obj = wait_phase(real_cluster, ns, "client", {"Succeeded", "Failed"}, timeout=120)
    logs = real_cluster.kubectl("logs", "-n", ns, "client").stdout
    assert obj["status"]["phase"] == "Succeeded", logs
    service_ip = real_cluster.get("service", "web", ns)["spec"]["clusterIP"]  # type: ignore[index]
    assert f"{service_ip} hello from a real pod" in logs


def test_pod_security_and_memory_limits_are_enforced(
    real_cluster: Cluster, restricted_namespace: str
) -> None:
    ns = restricted_namespace
    root = pod("root", "print(1)")
    root["metadata"]["namespace"] = ns
    root["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    refused = real_cluster.kubectl("apply", "-f", "-", input=json.dumps(root), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr
    hog = pod("hog", "x = bytearray(512 * 1024 * 1024); print(len(x))", memory="64Mi")
    hog["metadata"]["namespace"] = ns
    real_cluster.apply(hog)
    obj = wait_phase(real_cluster, ns, "hog", {"Failed"}, timeout=120)
    (status,) = obj["status"]["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "OOMKilled", status
