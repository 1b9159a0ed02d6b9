"""Binaries: versions (read from the wrapper go.mod files), Go builds and the versioned cache layout.

Binaries are cached by version under ``${RLJOB_CACHE:-~/.cache/rljob}/bin/<name>-<version>/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import HERE, HarnessError, cache_root, log
from procs import file_lock

GOMOD_DIR = HERE / "gomod"
KUBERAY_GOMOD_DIR = HERE / "gomod-kuberay"
# Kueue's manager: not among binaries() (an `up` does not build it); `up --kueue` and the Kueue
# e2e test build it on first use (kueue_binary(), ensure_one).
KUEUE_GOMOD_DIR = HERE / "gomod-kueue"

# Versions not pinned by a wrapper go.mod. KubeRay is pinned in gomod-kuberay/go.mod: v1.7.0 is
# listed by the module proxy but its source zip is not served (403), so v1.6.1 is the newest
# KubeRay that builds from the proxy.
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
# Cluster DNS of the real node (up --real-node): the newest CoreDNS the module proxy serves.
COREDNS_VERSION = "v1.14.7"
# The real node's NetworkPolicy enforcement (its firewall controller only: iptables and ipset). The
# one version the module proxy serves here; security flaws are reported against it, and it runs only
# inside the dev cluster's node, never in what rljob ships.
KUBE_ROUTER_VERSION = "v2.1.0"
PAUSE_DIR = HERE / "pause"


def gomod_versions() -> dict[str, str]:
    """Kubernetes, etcd, KubeRay and Kueue versions, read from the wrapper modules (go.mod is the one
    source)."""
    found: dict[str, str] = {}
    for key, gomod, mod in (
        ("kubernetes", GOMOD_DIR, "k8s.io/kubernetes"),
        ("etcd", GOMOD_DIR, "go.etcd.io/etcd/server/v3"),
        ("kuberay", KUBERAY_GOMOD_DIR, "github.com/ray-project/kuberay/ray-operator"),
        ("kueue", KUEUE_GOMOD_DIR, "sigs.k8s.io/kueue"),
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


def kube_ldflags(kube: str) -> str:
    """The version stamps Kubernetes' own release builds set (kubectl version, /version)."""
    major, minor = kube.lstrip("v").split(".")[:2]
    return " ".join(
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


def binaries() -> list[Binary]:
    v = gomod_versions()
    kube = v["kubernetes"]
    kube_ld = kube_ldflags(kube)
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


def real_node_binaries() -> list[Binary]:
    """What `up --real-node` runs besides the control plane: the kubelet and kube-proxy from the same
    module set as the API server, CoreDNS, kube-router (NetworkPolicy) and the pod sandbox's pause
    (tools/devcluster/pause)."""
    kube = gomod_versions()["kubernetes"]
    pause_hash = hashlib.sha256((PAUSE_DIR / "main.go").read_bytes()).hexdigest()[:12]
    return [
        Binary(c, kube, f"k8s.io/kubernetes/cmd/{c}", False, kube_ldflags(kube))
        for c in ("kubelet", "kube-proxy")
    ] + [
        Binary("coredns", COREDNS_VERSION, f"github.com/coredns/coredns@{COREDNS_VERSION}", True),
        Binary(
            "kube-router",
            KUBE_ROUTER_VERSION,
            f"github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@{KUBE_ROUTER_VERSION}",
            True,
        ),
        Binary("pause", pause_hash, ".", False, gomod=PAUSE_DIR),
    ]


def ensure_real_node_built() -> dict[str, Path]:
    return {b.name: ensure_one(b) for b in real_node_binaries()}


def kueue_binary() -> Binary:
    version = gomod_versions()["kueue"]
    return Binary(
        "kueue",
        version,
        "sigs.k8s.io/kueue/cmd/kueue",
        False,
        f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={version}",
        gomod=KUEUE_GOMOD_DIR,
    )


# Files of a binary's Go module its users need, copied next to it when it is built:
# name -> (module, [(directory in the module, glob, directory in the cache entry)]).
MODULE_FILES: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "ray-operator": ("github.com/ray-project/kuberay/ray-operator", [("config/crd/bases", "*.yaml", "crds")]),
    "kueue": (
        "sigs.k8s.io/kueue",
        [
            ("config/components/crd/bases", "*.yaml", "crds"),
            ("config/components/webhook", "manifests.yaml", "webhook"),
        ],
    ),
}


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
    extras = MODULE_FILES.get(b.name, ("", []))[1]
    if b.path.exists() and all((b.dir / dest).is_dir() for _, _, dest in extras):
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
        if b.name in MODULE_FILES:
            copy_module_files(go, env, b, tmp, logfile)
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


def copy_module_files(go: str, env: dict[str, str], b: Binary, dest: Path, logfile: Path) -> None:
    """Copies MODULE_FILES[b.name] out of the module cache (KubeRay's and Kueue's CRDs, Kueue's
    webhook configurations) into the cache entry being built at `dest`."""
    mod, files = MODULE_FILES[b.name]
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
        raise HarnessError(f"files of {mod}", f"go mod download {mod} failed", logfile)
    root = Path(json.loads(proc.stdout)["Dir"])
    for src, pattern, into in files:
        found = sorted((root / src).glob(pattern))
        if not found:
            raise HarnessError(f"files of {mod}", f"no {src}/{pattern} in {root}", logfile)
        (dest / into).mkdir(parents=True)
        for f in found:
            shutil.copyfile(f, dest / into / f.name)


def ensure_one(b: Binary) -> Path:
    """One binary (helm for the chart tests, kstatus-check for the GitOps tests), built under the
    cache's build lock unless it is cached already."""
    if not b.path.exists():
        with file_lock(cache_root() / "bin" / ".build.lock"):
            build_one(b, go_binary())  # a no-op if another process built it meanwhile
    return b.path


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
