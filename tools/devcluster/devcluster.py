#!/usr/bin/env python3
"""Local Kubernetes control plane for rljob e2e tests.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from the Go module
proxy; kwok fakes nodes and pods; the real KubeRay operator runs out of cluster; RayJob entrypoints
run on a real local Ray head (CPU) reached through a small forwarding proxy (dashproxy.py).

Subcommands: build, up, down, status, env. See docs/devcluster.md.

Binaries are cached by version under ``${RLJOB_CACHE:-~/.cache/rljob}/bin/<name>-<version>/``;
cluster state (kwok workdir with certs, etcd data and component logs, our logs, kubeconfig, state
file) lives under ``${RLJOB_CACHE}/clusters/<name>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GOMOD_DIR = HERE / "gomod"
KUBERAY_GOMOD_DIR = HERE / "gomod-kuberay"

# Versions not pinned by a wrapper go.mod. KubeRay is pinned in gomod-kuberay/go.mod: v1.7.0 is
# listed by the module proxy but its source zip is not served (403), so v1.6.1 is the newest
# KubeRay that builds from the proxy.
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"

DEFAULT_CLUSTER = "rljob-dev"
LOOPBACK = "127.0.0.1"
RAY_DASHBOARD_PORT_IN_CLUSTER = 8265
MARKER_ENV = "RLJOB_DEVCLUSTER_DIR"


class HarnessError(Exception):
    """A component failed; carries which one and where its log is."""

    def __init__(self, component: str, message: str, log: Path | None = None) -> None:
        super().__init__(f"{component}: {message}")
        self.component = component
        self.message = message
        self.log = log

    def report(self) -> str:
        lines = [f"devcluster: {self.component} failed: {self.message}"]
        if self.log is not None:
            lines.append(f"  log: {self.log}")
            tail = read_tail(self.log, 25)
            if tail:
                lines.append("  --- last lines of the log ---")
                lines.extend("  " + line for line in tail)
        return "\n".join(lines)


def read_tail(path: Path, n: int) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            return f.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def log(msg: str) -> None:
    print(f"[devcluster] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# paths and versions


def cache_root() -> Path:
    return Path(os.environ.get("RLJOB_CACHE") or Path.home() / ".cache" / "rljob").expanduser()


def cluster_dir(name: str) -> Path:
    return cache_root() / "clusters" / name


def gomod_versions() -> dict[str, str]:
    """Kubernetes, etcd and KubeRay versions, read from the wrapper modules (go.mod is the one source)."""
    found: dict[str, str] = {}
    for key, gomod, mod in (
        ("kubernetes", GOMOD_DIR, "k8s.io/kubernetes"),
        ("etcd", GOMOD_DIR, "go.etcd.io/etcd/server/v3"),
        ("kuberay", KUBERAY_GOMOD_DIR, "github.com/ray-project/kuberay/ray-operator"),
    ):
        text = (gomod / "go.mod").read_text()
        m = re.search(rf"^\s*(?:require\s+)?{re.escape(mod)}\s+(v\S+)", text, re.M)
        if not m:
            raise HarnessError("build", f"{mod} is not required in {gomod / 'go.mod'}")
        found[key] = m.group(1)
    return found


@dataclasses.dataclass(frozen=True)
class Binary:
    name: str
    version: str
    package: str  # package path (built inside a wrapper module) or module@version (go install)
    installed: bool  # True: `go install pkg@version`; False: `go build` inside the wrapper module
    ldflags: str = "-s -w"
    gomod: Path = GOMOD_DIR

    @property
    def dir(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}"

    @property
    def path(self) -> Path:
        return self.dir / self.name


def binaries() -> list[Binary]:
    v = gomod_versions()
    kube = v["kubernetes"]
    major, minor = kube.lstrip("v").split(".")[:2]
    kube_ld = " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={kube}",
            f"-X k8s.io/component-base/version.gitMajor={major}",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
            f"-X k8s.io/client-go/pkg/version.gitVersion={kube}",
            f"-X k8s.io/client-go/pkg/version.gitMajor={major}",
            f"-X k8s.io/client-go/pkg/version.gitMinor={minor}",
        ]
    )
    bins = [
        Binary(c, kube, f"k8s.io/kubernetes/cmd/{c}", False, kube_ld)
        for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    ]
    bins += [
        Binary("etcd", v["etcd"], "go.etcd.io/etcd/server/v3", False),
        Binary("kwok", KWOK_VERSION, f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}", True),
        Binary("kwokctl", KWOK_VERSION, f"sigs.k8s.io/kwok/cmd/kwokctl@{KWOK_VERSION}", True),
        Binary(
            "ray-operator",
            v["kuberay"],
            "github.com/ray-project/kuberay/ray-operator",
            False,
            gomod=KUBERAY_GOMOD_DIR,
        ),
        Binary(
            "helm",
            HELM_VERSION,
            f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}",
            True,
            f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        ),
    ]
    return bins


def bin_by_name() -> dict[str, Binary]:
    return {b.name: b for b in binaries()}


def kuberay_crd_dir() -> Path:
    return bin_by_name()["ray-operator"].dir / "crds"


# --------------------------------------------------------------------------------------------
# build


def go_binary() -> str:
    for cand in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and Path(cand).exists():
            return cand
    raise HarnessError("build", "no Go toolchain: set GO=/path/to/go or put go on PATH")


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-buildvcs=false -mod=readonly"
    return env


def build_one(b: Binary, go: str) -> float:
    """Builds one binary into its versioned cache dir; returns seconds spent (0 if cached)."""
    if b.path.exists() and (b.name != "ray-operator" or kuberay_crd_dir().is_dir()):
        return 0.0
    logdir = cache_root() / "logs" / "build"
    logdir.mkdir(parents=True, exist_ok=True)
    logfile = logdir / f"{b.name}-{b.version}.log"
    b.dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{b.name}-", dir=b.dir.parent))
    t0 = time.monotonic()
    env = go_env()
    if b.installed:
        env["GOBIN"] = str(tmp)
        cmd = [go, "install", "-trimpath", "-ldflags", b.ldflags, b.package]
        cwd = tmp
    else:
        cmd = [go, "build", "-trimpath", "-ldflags", b.ldflags, "-o", str(tmp / b.name), b.package]
        cwd = b.gomod
    log(f"building {b.name} {b.version} (log: {logfile})")
    try:
        with logfile.open("w") as out:
            out.write("$ " + " ".join(cmd) + f"\n(cwd {cwd})\n")
            out.flush()
            proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
        if proc.returncode != 0:
            raise HarnessError(f"build of {b.name} {b.version}", f"go exited {proc.returncode}", logfile)
        built = tmp / b.name
        if not built.exists():
            raise HarnessError(f"build of {b.name} {b.version}", f"{built} was not produced", logfile)
        if b.name == "ray-operator":
            copy_kuberay_crds(go, env, b, tmp / "crds", logfile)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if b.dir.exists():
            shutil.rmtree(b.dir)
        tmp.rename(b.dir)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"build of {b.name}", "timed out after 3600 s", logfile) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    took = time.monotonic() - t0
    log(f"built {b.name} in {took:.0f} s")
    return took


def copy_kuberay_crds(go: str, env: dict[str, str], b: Binary, dest: Path, logfile: Path) -> None:
    """KubeRay's CRDs ship in its Go module: config/crd/bases/."""
    mod = "github.com/ray-project/kuberay/ray-operator"
    proc = subprocess.run(
        [go, "mod", "download", "-json", mod],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=b.gomod,
    )
    if proc.returncode != 0:
        with logfile.open("a") as out:
            out.write(proc.stdout + proc.stderr)
        raise HarnessError("KubeRay CRDs", f"go mod download {mod} failed", logfile)
    src = Path(json.loads(proc.stdout)["Dir"]) / "config" / "crd" / "bases"
    dest.mkdir(parents=True)
    for f in sorted(src.glob("*.yaml")):
        shutil.copyfile(f, dest / f.name)


def cmd_build(args: argparse.Namespace) -> int:
    ensure_built(verbose=True)
    return 0


def ensure_built(verbose: bool = False) -> dict[str, Path]:
    bins = binaries()
    missing = [b for b in bins if not b.path.exists()]
    if missing or not kuberay_crd_dir().is_dir():
        go = go_binary()
        t0 = time.monotonic()
        with file_lock(cache_root() / "bin" / ".build.lock"):
            for b in bins:
                build_one(b, go)
        log(f"build finished in {time.monotonic() - t0:.0f} s")
    elif verbose:
        log("all binaries are cached:")
    if verbose:
        for b in bins:
            print(f"  {b.name:24s} {b.version:8s} {b.path}")
    return {b.name: b.path for b in bins}


def link_farm(dest: Path, paths: dict[str, Path]) -> Path:
    """A directory of symlinks to the cached binaries, for PATH."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, target in paths.items():
        link = dest / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return dest


# --------------------------------------------------------------------------------------------
# process helpers


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for the lock {path} (another devcluster command is running)")
            deadline = time.monotonic() + 1800
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise HarnessError("lock", f"{path} held for more than 30 minutes") from None
                    time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids_matching(marker: str) -> list[int]:
    """Our processes whose command line mentions ``marker`` (a path unique to this cluster)."""
    me = os.getpid()
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != me and marker in cmdline(int(p.name)):
            out.append(int(p.name))
    return out


def pids_with_env(key: str, value: str) -> list[int]:
    """Our processes whose environment holds ``key=value`` (inherited by every descendant)."""
    needle = f"{key}={value}".encode()
    me = os.getpid()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            out.append(int(p.name))
    return out


def stop_pid(pid: int, marker: str, what: str, grace: float = 15.0) -> None:
    """Stops one process (and its process group, when it leads one) that we started.

    ``marker`` must appear in its command line, so a recycled pid is never signalled.
    """
    if not pid_alive(pid) or marker not in cmdline(pid):
        return
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    group = pgid == pid  # started with start_new_session=True
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if not pid_alive(pid):
            return
        log(f"{what} (pid {pid}) still running {grace:.0f} s after SIGTERM; sending SIGKILL")


def spawn(cmd: list[str], logfile: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=logfile.parent,
        )


def http_get(url: str, timeout: float = 3.0, proxy: str | None = None) -> tuple[int, bytes]:
    handler = urllib.request.ProxyHandler({"http": proxy} if proxy else {})
    opener = urllib.request.build_opener(handler)
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait_for(
    what: str,
    check: Any,
    timeout: float,
    log_path: Path | None = None,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.5,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise HarnessError(
                what, f"process exited with code {proc.returncode} before it was ready", log_path
            )
        time.sleep(interval)
    raise HarnessError(what, f"not ready after {timeout:.0f} s", log_path)


# --------------------------------------------------------------------------------------------
# cluster


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
        # Ray puts unix sockets below its temp dir; keep the path well under the 107-byte limit.
        p = self.dir / "ray"
        if len(str(p)) > 60:
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


def kwokctl_config(ctx: Ctx, kube_version: str) -> Path:
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
    }
    path = ctx.dir / "kwokctl.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


def start_control_plane(ctx: Ctx, state: dict[str, Any]) -> None:
    kube_version = gomod_versions()["kubernetes"]
    conf = kwokctl_config(ctx, kube_version)
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
    with logfile.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        try:
            proc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=ctx.env(), timeout=420, cwd=ctx.dir
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError("kwokctl create cluster", "timed out after 420 s", logfile) from exc
    if proc.returncode != 0:
        raise HarnessError(
            "kwokctl create cluster",
            f"exited {proc.returncode}; component logs: {ctx.kwok_cluster_dir / 'logs'}",
            logfile,
        )
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


def node_manifests() -> list[dict[str, Any]]:
    nodes = []
    for pool in NODE_POOLS:
        for i in range(pool["count"]):
            name = f"{pool['prefix']}-{i}"
            capacity = {
                "cpu": pool["cpu"],
                "memory": pool["memory"],
                "pods": "110",
                "ephemeral-storage": "1Ti",
            }
            alloc = {"cpu": pool["cpu_alloc"], "memory": pool["memory_alloc"], "pods": "110"}
            alloc["ephemeral-storage"] = "900Gi"
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


def create_nodes(ctx: Ctx) -> list[str]:
    nodes = node_manifests()
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


def install_kuberay_crds(ctx: Ctx) -> None:
    crds = kuberay_crd_dir()
    ctx.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), timeout=120)
    names = [f"crd/{yaml.safe_load(f.read_text())['metadata']['name']}" for f in sorted(crds.glob("*.yaml"))]
    ctx.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names, timeout=90)
    log(f"KubeRay {gomod_versions()['kuberay']} CRDs established: {', '.join(n[4:] for n in names)}")


def venv_bin() -> Path:
    return Path(sys.executable).parent


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
        "--num-gpus=0",
        "--object-store-memory=268435456",
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
    op = state.get("operator")
    out["ray-operator"] = "ok" if op and http_get(op["health"] + "/readyz")[0] == 200 else "not answering"
    return out


def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        bins = ensure_built()
    except HarnessError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    ctx = make_ctx(args.name, bins)
    with file_lock(ctx.dir.parent / f".{ctx.name}.lock"):
        state = load_state(ctx)
        if state is not None:
            h = health(ctx, state)
            if all(v == "ok" for v in h.values()):
                log(f"cluster {ctx.name} is already running: reusing it ({ctx.state_file})")
                print_summary(ctx, state)
                return 0
            bad = ", ".join(f"{k}: {v}" for k, v in h.items() if v != "ok")
            if not args.recreate:
                print(
                    f"devcluster: cluster {ctx.name} exists but is unhealthy ({bad}).\n"
                    f"  Run `{sys.executable} {__file__} down --name {ctx.name}` first, or pass --recreate.",
                    file=sys.stderr,
                )
                return 1
            log(f"cluster {ctx.name} is unhealthy ({bad}); recreating it")
            teardown(ctx, state)
        elif ctx.kwok_cluster_dir.exists():
            log(f"found leftovers of cluster {ctx.name} without a state file; cleaning them up")
            teardown(ctx, {})
        ctx.dir.mkdir(parents=True, exist_ok=True)
        ctx.logs.mkdir(parents=True, exist_ok=True)
        link_farm(ctx.bin_dir, bins)
        state = {
            "name": ctx.name,
            "dir": str(ctx.dir),
            "kubeconfig": str(ctx.kubeconfig),
            "bin_dir": str(ctx.bin_dir),
            "kubectl": str(ctx.bin_dir / "kubectl"),
            "logs": str(ctx.logs),
            "versions": {b.name: b.version for b in binaries()},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "creator_pid": os.getpid(),
        }
        save_state(ctx, state)
        try:
            start_control_plane(ctx, state)
            state["nodes"] = create_nodes(ctx)
            install_kuberay_crds(ctx)
            start_ray(ctx, state, args.ray_cpus)
            start_proxy(ctx, state)
            start_operator(ctx, state)
        except (HarnessError, subprocess.TimeoutExpired, OSError) as exc:
            report = exc.report() if isinstance(exc, HarnessError) else f"devcluster: up failed: {exc}"
            log("tearing down what was started")
            saved = teardown(ctx, state)
            if saved:
                # The cluster dir is gone now; point at the copies teardown kept.
                report = report.replace(str(ctx.kwok_cluster_dir / "logs"), str(saved / "control-plane"))
                report = report.replace(str(ctx.logs), str(saved / "devcluster"))
                report += f"\n  all logs of the failed attempt: {saved}"
            print(report, file=sys.stderr)
            return 1
        state["ready"] = True
        state["up_seconds"] = round(time.monotonic() - t0, 1)
        save_state(ctx, state)
    log(f"cluster {ctx.name} is up in {time.monotonic() - t0:.1f} s")
    print_summary(ctx, state)
    return 0


def print_summary(ctx: Ctx, state: dict[str, Any]) -> None:
    print(f"  kubeconfig:     {ctx.kubeconfig}")
    print(f"  apiserver:      {state.get('apiserver')}")
    print(f"  ray dashboard:  {state.get('ray', {}).get('dashboard')}")
    print(f"  logs:           {ctx.logs}  (control plane: {ctx.kwok_cluster_dir / 'logs'})")
    print(f'  shell:          eval "$({sys.executable} {Path(__file__)} env --name {ctx.name})"')


def teardown(ctx: Ctx, state: dict[str, Any]) -> Path | None:
    """Stops everything of this cluster; keeps its logs in ${RLJOB_CACHE}/logs/<name>-last."""
    marker_ray = state.get("ray", {}).get("temp_dir") or str(ctx.ray_temp)
    # `ray start --block` drains for up to 30 s on SIGTERM; nothing needs draining here.
    for key, what, marker, grace in (
        ("operator", "ray-operator", "ray-operator", 15.0),
        ("proxy", "dashboard proxy", "dashproxy.py", 15.0),
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
        kwokctl = ctx.bins.get("kwokctl")
        if kwokctl and Path(kwokctl).exists():
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    [
                        str(kwokctl),
                        "delete",
                        "cluster",
                        f"--name={ctx.name}",
                        f"--kubeconfig={ctx.kubeconfig}",
                    ],
                    env=ctx.env(),
                    capture_output=True,
                    timeout=120,
                    cwd=ctx.dir,
                )
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
    if Path(marker_ray).exists() and not str(marker_ray).startswith(str(ctx.dir)):
        shutil.rmtree(marker_ray, ignore_errors=True)
    return saved


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


def cmd_down(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    ctx = make_ctx(args.name)
    with file_lock(ctx.dir.parent / f".{ctx.name}.lock"):
        state = load_state(ctx)
        if state is None and not ctx.dir.exists():
            log(f"cluster {ctx.name} is not running")
            return 0
        saved = teardown(ctx, state or {})
    log(f"cluster {ctx.name} stopped in {time.monotonic() - t0:.1f} s (logs kept in {saved})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    ctx = make_ctx(args.name)
    state = load_state(ctx)
    h = health(ctx, state)
    ok = state is not None and all(v == "ok" for v in h.values())
    if args.json:
        print(json.dumps({"ok": ok, "health": h, "state": state}, indent=2))
        return 0 if ok else 1
    if state is None:
        print(f"cluster {ctx.name}: not running ({ctx.state_file} missing)")
        return 1
    print(f"cluster {ctx.name}: {'healthy' if ok else 'UNHEALTHY'}")
    for k, v in h.items():
        print(f"  {k:16s} {v}")
    print_summary(ctx, state)
    if ok:
        nodes = ctx.kubectl("get", "nodes", "-L", "rljob.dev/gpu-pool", check=False).stdout
        print(nodes.rstrip())
    return 0 if ok else 1


def cmd_env(args: argparse.Namespace) -> int:
    ctx = make_ctx(args.name)
    missing = [str(p) for p in ctx.bins.values() if not p.exists()]
    if missing:
        print(
            f"devcluster: binaries not built yet ({missing[0]} ...): run `devcluster.py build`",
            file=sys.stderr,
        )
        return 1
    link_farm(ctx.bin_dir, ctx.bins)
    print(f"export KUBECONFIG={ctx.kubeconfig}")
    print(f'export PATH={ctx.bin_dir}:"$PATH"')
    state = load_state(ctx)
    if state and "ray" in state:
        print(f"export RLJOB_RAY_DASHBOARD={state['ray']['dashboard']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devcluster.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="build the binaries into the cache (no-op when cached)")
    p.set_defaults(func=cmd_build)
    for name, func, help_ in (
        ("up", cmd_up, "build if needed, start (or reuse) the cluster"),
        ("down", cmd_down, "stop everything the cluster started and remove its state"),
        ("status", cmd_status, "health of each component; exit 0 when all are healthy"),
        ("env", cmd_env, 'print export lines for a shell: eval "$(devcluster.py env)"'),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--name", default=os.environ.get("RLJOB_CLUSTER", DEFAULT_CLUSTER))
        p.set_defaults(func=func)
        if name == "up":
            p.add_argument("--recreate", action="store_true", help="tear down an unhealthy cluster first")
            p.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs of the local Ray head")
        if name == "status":
            p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except HarnessError as exc:
        print(exc.report(), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
