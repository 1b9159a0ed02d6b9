"""Control plane: kwokctl configuration and start, fake node pools, KubeRay CRDs."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from build import KWOK_VERSION, gomod_versions, kuberay_crd_dir
from common import LOOPBACK, HarnessError, log
from procs import machine_lock, port_bound, wait_for
from state import Ctx, save_state
from teardown import delete_control_plane

# kwokctl checks a port is free by binding it, then starts the server on it: another program binding it
# in between makes a component fail with this; `create` is then tried again (kwokctl skips ports in use).
ADDRESS_IN_USE = "address already in use"
CREATE_ATTEMPTS = 3


NODE_MONITOR_PERIOD = "5s"
NODE_MONITOR_GRACE_PERIOD = "40s"


def kwokctl_config(ctx: Ctx, kube_version: str, real_node: bool = False) -> Path:
    conf = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "kubeVersion": kube_version,
            "bindAddress": LOOPBACK,
            "quietPull": True,
            "kubeApiserverBinary": str(ctx.bins["kube-apiserver"]),
            "kubeControllerManagerBinary": str(ctx.bins["kube-controller-manager"]),
            "kubeSchedulerBinary": str(ctx.bins["kube-scheduler"]),
            "kwokControllerBinary": str(ctx.bins["kwok"]),
            "etcdBinary": str(ctx.bins["etcd"]),
            "kubectlBinary": str(ctx.bins["kubectl"]),
            "cacheDir": str(ctx.dir / "kwok-cache"),
        },
        # As on hardened clusters (OpenShift enables it): an owner reference that blocks the
        # owner's deletion needs `update` on the owner's finalizers, which the chart's role grants.
        "componentsPatches": [
            {
                "name": "kube-apiserver",
                "extraArgs": [
                    {"key": "enable-admission-plugins", "value": "OwnerReferencesPermissionEnforcement"}
                ],
            }
        ],
    }
    if real_node:
        real_node_patches(ctx, conf)
    path = ctx.dir / "kwokctl.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


def real_node_patches(ctx: Ctx, conf: dict[str, Any]) -> None:
    """A cluster with a real node: the API server reachable from pods and dialling kubelets with a
    client certificate, and kwok leaving alone every node it did not create (realnode.py)."""
    from realnode_config import KUBERNETES_SERVICE_IP, NODE_IP, apiserver_args

    pki = ctx.kwok_cluster_dir / "pki"
    conf["options"]["kubeApiserverCertSANs"] = [NODE_IP, KUBERNETES_SERVICE_IP]
    conf["componentsPatches"][0]["extraArgs"] += apiserver_args(pki / "admin.crt", pki / "admin.key")
    # kwokctl starts the node controller with a 25 s period and a 3m20s grace (its defaults for fake
    # nodes): a stopped kubelet showed as NotReady only after ~3.5 minutes. A real node gets the
    # upstream timing: NotReady 40 s after the kubelet's last heartbeat, checked every 5 s.
    conf["componentsPatches"].append(
        {
            "name": "kube-controller-manager",
            "extraArgs": [
                {"key": "node-monitor-period", "value": NODE_MONITOR_PERIOD},
                {"key": "node-monitor-grace-period", "value": NODE_MONITOR_GRACE_PERIOD},
            ],
        }
    )
    conf["componentsPatches"].append(
        {
            "name": "kwok-controller",
            "extraArgs": [
                {"key": "manage-all-nodes", "value": "false"},
                {"key": "manage-nodes-with-annotation-selector", "value": "kwok.x-k8s.io/node=fake"},
            ],
        }
    )


def start_control_plane(ctx: Ctx, state: dict[str, Any]) -> None:
    kube_version = gomod_versions()["kubernetes"]
    conf = kwokctl_config(ctx, kube_version, real_node=bool(state.get("real_node_requested")))
    logfile = ctx.logs / "kwokctl-create.log"
    cmd = [
        str(ctx.bins["kwokctl"]),
        f"--config={conf}",
        "create",
        "cluster",
        f"--name={ctx.name}",
        f"--kubeconfig={ctx.kubeconfig}",
        "--wait=3m",
        "--timeout=5m",
    ]
    log(
        f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (kwokctl {KWOK_VERSION})"
    )
    state["kwok"] = {"workdir": str(ctx.kwok_workdir), "logs": str(ctx.kwok_cluster_dir / "logs")}
    save_state(ctx, state)
    logfile.write_text("")
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        # kwokctl picks its ports itself, by the same rule in every process: two creates at once (two
        # clusters starting together) would choose the same ones. One at a time on this machine, until its
        # servers listen, and never beside another devcluster command choosing ports.
        with machine_lock():
            returncode, clash = _kwokctl_create(cmd, logfile, ctx)
            if returncode == 0 and clash is None:
                _wait_listening(ctx)
        if returncode == 0 and clash is None:
            break
        if clash is None or attempt == CREATE_ATTEMPTS:
            raise HarnessError(
                "kwokctl create cluster",
                f"exited {returncode}; component logs: {ctx.kwok_cluster_dir / 'logs'}"
                + (f"; {clash}" if clash else ""),
                logfile,
            )
        log(f"{clash}: deleting the control plane and creating it again ({attempt + 1}/{CREATE_ATTEMPTS})")
        with logfile.open("a") as out:
            out.write(f"\n# attempt {attempt}: {clash}; deleted and created again\n")
        delete_control_plane(ctx)
    kc = yaml.safe_load(ctx.kubeconfig.read_text())
    server = kc["clusters"][0]["cluster"]["server"]
    state["apiserver"] = server
    save_state(ctx, state)
    wait_for(
        "kube-apiserver /readyz",
        lambda: ctx.kubectl("get", "--raw=/readyz", check=False, timeout=10).returncode == 0,
        120,
        ctx.kwok_cluster_dir / "logs" / "kube-apiserver.log",
    )
    log(f"kube-apiserver {kube_version} ready at {server}")


def _kwokctl_create(cmd: list[str], logfile: Path, ctx: Ctx) -> tuple[int, str | None]:
    """Runs `kwokctl create cluster`: its exit code, and the line of a component that could not bind
    its port. That is noticed as it happens: kwokctl itself waits 5 minutes for the API server and
    then exits 0 anyway."""
    logs = ctx.kwok_cluster_dir / "logs"
    with logfile.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ctx.env(), cwd=ctx.dir)
        try:
            deadline = time.monotonic() + 420
            while proc.poll() is None:
                clash = port_clash(logs)
                if clash is not None:
                    proc.kill()
                    proc.wait()
                    return proc.returncode, clash
                if time.monotonic() > deadline:
                    raise HarnessError("kwokctl create cluster", "timed out after 420 s", logfile)
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, port_clash(logs)


def _wait_listening(ctx: Ctx, timeout: float = 30) -> None:
    """Until every port kwokctl chose (its kwok.yaml) is bound, so the next cluster's kwokctl skips it.
    `--wait` covers the API server; the controllers may bind theirs a moment later."""
    ports: list[int] = []
    with contextlib.suppress(OSError, yaml.YAMLError):
        for doc in yaml.safe_load_all((ctx.kwok_cluster_dir / "kwok.yaml").read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "KwokctlConfiguration":
                opts = doc.get("options") or {}
                ports = [v for k, v in opts.items() if k.endswith("Port") and type(v) is int and v > 0]
    deadline = time.monotonic() + timeout
    while (idle := [p for p in ports if not port_bound(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    if idle:
        log(f"kwokctl's ports {idle} are not listening {timeout:.0f} s after the control plane started")


def port_clash(logs: Path) -> str | None:
    """'<component log>: <line>' for the first line saying a port was taken, in the control plane's logs."""
    for f in sorted(logs.glob("*.log")):
        with contextlib.suppress(OSError):
            for line in f.read_text(errors="replace").splitlines():
                if ADDRESS_IN_USE in line.lower():
                    return f"{f.name}: {line.strip()[-200:]}"
    return None


# Realistic shapes: a3-highgpu-8g (8x H100 80GB), g2-standard-48 (4x L4), n2-standard-32.
NODE_POOLS: list[dict[str, Any]] = [
    {
        "prefix": "gpu-h100",
        "count": 4,
        "gpus": 8,
        "cpu": "208",
        "cpu_alloc": "206",
        "memory": "1872Gi",
        "memory_alloc": "1800Gi",
        "labels": {
            "rljob.dev/gpu-pool": "h100",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
        },
    },
    {
        "prefix": "gpu-l4",
        "count": 2,
        "gpus": 4,
        "cpu": "48",
        "cpu_alloc": "47",
        "memory": "192Gi",
        "memory_alloc": "180Gi",
        "labels": {
            "rljob.dev/gpu-pool": "l4",
            "nvidia.com/gpu.product": "NVIDIA-L4",
            "nvidia.com/gpu.count": "4",
            "node.kubernetes.io/instance-type": "g2-standard-48",
        },
    },
    {
        "prefix": "cpu",
        "count": 2,
        "gpus": 0,
        "cpu": "32",
        "cpu_alloc": "31",
        "memory": "128Gi",
        "memory_alloc": "120Gi",
        "labels": {"node.kubernetes.io/instance-type": "n2-standard-32"},
    },
]


def node_manifests(gpu_pools_only: bool = False) -> list[dict[str, Any]]:
    """The kwok nodes; beside a real node only the GPU pools (CPU pods go to the real node)."""
    nodes = []
    for pool in NODE_POOLS:
        if gpu_pools_only and not pool["gpus"]:
            continue
        for i in range(pool["count"]):
            name = f"{pool['prefix']}-{i}"
            capacity = {
                "cpu": pool["cpu"],
                "memory": pool["memory"],
                "pods": "110",
                "ephemeral-storage": "1Ti",
            }
            alloc = {
                "cpu": pool["cpu_alloc"],
                "memory": pool["memory_alloc"],
                "pods": "110",
                "ephemeral-storage": "900Gi",
            }
            spec: dict[str, Any] = {}
            if pool["gpus"]:
                capacity["nvidia.com/gpu"] = str(pool["gpus"])
                alloc["nvidia.com/gpu"] = str(pool["gpus"])
                spec["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                            "rljob.dev/node-pool": pool["prefix"],
                            **pool["labels"],
                        },
                    },
                    "spec": spec,
                    "status": {
                        "capacity": capacity,
                        "allocatable": alloc,
                        "nodeInfo": {
                            "architecture": "amd64",
                            "operatingSystem": "linux",
                            "kubeletVersion": "fake",
                            "kubeProxyVersion": "fake",
                        },
                    },
                }
            )
    return nodes


def create_nodes(ctx: Ctx, gpu_pools_only: bool = False) -> list[str]:
    nodes = node_manifests(gpu_pools_only)
    doc = yaml.safe_dump_all(nodes, sort_keys=False)
    ctx.kubectl("apply", "-f", "-", input=doc)
    names = [n["metadata"]["name"] for n in nodes]
    proc = ctx.kubectl(
        "wait",
        "--for=condition=Ready",
        "--timeout=90s",
        *[f"node/{n}" for n in names],
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise HarnessError(
            "fake nodes (kwok)", proc.stderr.strip(), ctx.kwok_cluster_dir / "logs" / "kwok-controller.log"
        )
    log(f"{len(names)} fake nodes Ready: " + ", ".join(names))
    return names


def install_crds(ctx: Ctx, crds: Path) -> list[str]:
    """Server-side apply of the CRDs in `crds`, then wait until each is Established; their names."""
    ctx.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), timeout=180)
    names = [f"crd/{yaml.safe_load(f.read_text())['metadata']['name']}" for f in sorted(crds.glob("*.yaml"))]
    # Polled: `kubectl wait --for=condition=Established` fails outright ("accessor error: <nil>")
    # on a CRD whose status the API server has not written yet.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    for name in names:
        wait_for(
            f"{name} Established",
            lambda name=name: (
                ctx.kubectl("get", name, "-o", f"jsonpath={established}", check=False).stdout.strip()
                == "True"
            ),
            60,
            ctx.kwok_cluster_dir / "logs" / "kube-apiserver.log",
        )
    return names


def install_kuberay_crds(ctx: Ctx) -> None:
    names = install_crds(ctx, kuberay_crd_dir())
    log(f"KubeRay {gomod_versions()['kuberay']} CRDs established: {', '.join(n[4:] for n in names)}")
