"""A real node beside the kwok ones (`devcluster.py up --real-node`): containerd + runc from Debian's
packages, a kubelet and kube-proxy built from the API server's own module set, CoreDNS, a CNI
bridge, and kube-router enforcing NetworkPolicy. Pods on it are real containers; the kwok GPU pools
stay for the scheduling tests.

One real node per machine: its bridge, its routes and containerd's image store are machine-wide.
The kubelet and containerd share a private mount namespace in which the kernel settings the kubelet
insists on are shown to it (bind mounts over /proc/sys), so the host's are never changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import yaml
from build import ensure_real_node_built, real_node_binaries
from common import HarnessError, cache_root, log
from procs import free_ports, http_get, pid_alive, pids_matching, spawn, stop_pid, wait_for
from realnode_config import (
    BRIDGE,
    COREDNS_IMAGE,
    GUARD_CIDR,
    KERNEL_DEFAULTS,
    NODE_IP,
    NODE_LABELS,
    NODE_NAME,
    POD_CIDR,
    SANDBOX_IMAGE,
    SERVICE_CIDR,
    NodePaths,
    cni_conflist,
    containerd_toml,
    coredns_manifests,
    kube_proxy_config,
    kube_router_args,
    kubelet_config,
)
from state import Ctx, save_state

# Debian packages the node needs: command -> package.
NODE_COMMANDS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "ipset": "ipset",
    "conntrack": "conntrack",
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "podman": "podman",
}
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
CNI_DIR = Path("/usr/lib/cni")
# The kubelet, runc and Ray raise their open-files limit; root here may lack CAP_SYS_RESOURCE.
MIN_NOFILE = 16384
FORWARD_GUARD = ["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"]


def preflight() -> list[str]:
    """What the host lacks for a real node: one line each, saying how to get it."""
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append("root: the kubelet, containerd and the bridge need it (run as root)")
    packages = sorted({pkg for cmd, pkg in NODE_COMMANDS.items() if shutil.which(cmd) is None})
    plugins = [p for p in CNI_PLUGINS if not (CNI_DIR / p).exists()]
    if plugins:
        packages.append("containernetworking-plugins")
    if packages:
        missing.append(f"Debian packages {' '.join(packages)}: apt-get install {' '.join(packages)}")
    if not (Path("/sys/fs/cgroup/memory").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers").exists()):
        missing.append("a memory cgroup hierarchy at /sys/fs/cgroup: mount cgroup v1 or v2 there")
    import resource  # POSIX only; imported here so the module loads anywhere

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < MIN_NOFILE:
        missing.append(
            f"an open-files hard limit of at least {MIN_NOFILE} (it is {hard}): raise `ulimit -Hn`"
        )
    return missing


def install_packages() -> None:
    """apt-get install the Debian packages preflight() would find missing (as root)."""
    packages = sorted({pkg for cmd, pkg in NODE_COMMANDS.items() if shutil.which(cmd) is None})
    if any(not (CNI_DIR / plugin).exists() for plugin in CNI_PLUGINS):
        packages.append("containernetworking-plugins")
    if not packages or os.geteuid() != 0:
        return
    log(f"installing {' '.join(packages)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True)
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", *packages], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise HarnessError(
            "real node", f"apt-get install {' '.join(packages)} failed: {proc.stderr.strip()[-300:]}"
        )


def node_paths(ctx: Ctx) -> NodePaths:
    # containerd's images are a cache; its sockets need a short path (AF_UNIX: 107 bytes).
    return NodePaths(ctx.dir, cache_root() / "realnode" / "containerd", Path("/run/rljob-node"))


def ctr(p: NodePaths, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(p.socket), "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


def setup_network() -> None:
    """The pods' bridge holding the node's address, and guards so nothing of the range leaves."""
    if sh("ip", "link", "show", BRIDGE).returncode != 0:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    if NODE_IP not in sh("ip", "-o", "addr", "show", "dev", BRIDGE).stdout:
        sh("ip", "addr", "add", f"{NODE_IP}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    sh("ip", "route", "replace", "unreachable", GUARD_CIDR)
    # The host reaches Service addresses as a node does (kube-proxy's OUTPUT rules rewrite them to a
    # pod's): KubeRay, run on the host, asks CoreDNS at the kube-dns Service for the heads' names.
    sh("ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)
    if sh("iptables", "-C", *FORWARD_GUARD).returncode != 0:
        sh("iptables", "-I", *FORWARD_GUARD)
    # Service traffic from a pod to a pod is routed back out of the bridge: forwarding, guarded above.
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")


def teardown_network() -> None:
    while sh("iptables", "-C", *FORWARD_GUARD).returncode == 0:
        sh("iptables", "-D", *FORWARD_GUARD)
    # The kubelet's own chains (KUBE-FIREWALL, canaries) and kube-router's (KUBE-ROUTER-*, KUBE-NWPLCY-*,
    # KUBE-POD-FW-*) outlive them; kube-proxy --cleanup took its.
    for table in ("nat", "filter", "mangle"):
        rules = sh("iptables", "-t", table, "-S").stdout.splitlines()
        for rule in rules:
            if rule.startswith("-A ") and " -j KUBE-" in rule and not rule.split()[1].startswith("KUBE-"):
                sh("iptables", "-t", table, "-D", *shlex.split(rule)[1:])
        chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
        for chain in chains:
            sh("iptables", "-t", table, "-F", chain)
        for chain in chains:
            sh("iptables", "-t", table, "-X", chain)
    # kube-router's ipsets, once no rule refers to them (its --cleanup-config leaves them, and more).
    if shutil.which("ipset"):
        for name in sh("ipset", "list", "-n").stdout.split():
            if name.startswith("KUBE-"):
                sh("ipset", "destroy", name)
    sh("ip", "route", "del", SERVICE_CIDR, "dev", BRIDGE)
    sh("ip", "route", "del", "unreachable", GUARD_CIDR)
    sh("ip", "link", "del", BRIDGE)


def node_image(name: str, binary: Path, entrypoint: list[str]) -> Path:
    """An OCI archive of one static binary (the pause and CoreDNS images), cached by its version."""
    version = binary.parent.name
    archive = cache_root() / "images" / f"{name}-{version}.oci.tar"
    if archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    ref = f"docker.io/rljob/{name}:devcluster"
    tmp = archive.with_suffix(".part")
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(_tempdir()))
        (work / "root").mkdir()
        shutil.copy2(binary, work / "root" / binary.name)
        subprocess.run(["tar", "-C", str(work / "root"), "-cf", str(work / "layer.tar"), "."], check=True)
        change = f"ENTRYPOINT {json.dumps(entrypoint)}"
        subprocess.run(
            [
                "podman",
                "import",
                "-q",
                "--change",
                change,
                "--change",
                "USER 65532:65532",
                str(work / "layer.tar"),
                ref,
            ],
            check=True,
            capture_output=True,
        )
        tmp.unlink(missing_ok=True)
        subprocess.run(["podman", "save", "-q", "--format", "oci-archive", "-o", str(tmp), ref], check=True)
    tmp.rename(archive)
    return archive


@contextlib.contextmanager
def _tempdir():  # type: ignore[no-untyped-def]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rljob-node-image-") as d:
        yield d


def archive_manifest(archive: Path) -> tuple[str, str]:
    """(reference, manifest digest) of a one-image OCI archive (index.json's ref.name annotation)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise HarnessError("real node", f"{archive} has no index.json: not an OCI archive")
        index = json.load(member)
    for manifest in index.get("manifests", []):
        ref = manifest.get("annotations", {}).get("org.opencontainers.image.ref.name")
        if ref:
            return str(ref), str(manifest["digest"])
    raise HarnessError("real node", f"{archive}: its index.json names no image")


def image_digest(p: NodePaths, ref: str) -> str | None:
    """The manifest digest containerd holds for `ref`, if any."""
    for line in ctr(p, "images", "ls", f"name=={ref}", timeout=60).stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 2 and cols[0] == ref:
            return cols[2]
    return None


def import_image(p: NodePaths, archive: Path, ref: str | None = None) -> str:
    """Imports an OCI archive into the node's containerd (pods name the image with pull policy
    IfNotPresent or Never: there is no registry). Returns the image's reference."""
    named, digest = archive_manifest(archive)
    ref = ref or named
    if image_digest(p, ref) == digest:
        return ref  # already there: importing a multi-GB archive again takes minutes
    before = set(ctr(p, "images", "ls", "-q", timeout=60).stdout.split())
    proc = ctr(p, "images", "import", str(archive))
    if proc.returncode != 0 and "snapshot" in proc.stderr:
        # containerd's garbage collection of the image this one replaces can remove a shared layer's
        # snapshot while the unpack counts on it ("parent snapshot ... does not exist"): once the
        # old image is gone, a second import unpacks every layer it needs.
        log(f"real node: {proc.stderr.strip()}; importing {archive.name} again")
        ctr(p, "images", "rm", ref, timeout=120)
        proc = ctr(p, "images", "import", str(archive))
    if proc.returncode != 0:
        raise HarnessError("real node", f"importing {archive.name} into containerd: {proc.stderr.strip()}")
    names = set(ctr(p, "images", "ls", "-q", timeout=60).stdout.split())
    if ref not in names:
        imported = sorted(names - before) or [n for n in names if n.split(":")[0].endswith(ref.split(":")[0])]
        if not imported:
            raise HarnessError("real node", f"{archive.name} imported, but no image {ref} in containerd")
        ctr(p, "images", "tag", "--force", imported[0], ref, timeout=60)
    return ref


def load_images(ctx: Ctx, state: dict[str, Any], archives: list[Path]) -> list[str]:
    p = node_paths(ctx)
    return [import_image(p, archive) for archive in archives]


def real_node_elsewhere(ctx: Ctx) -> str | None:
    """The name of another cluster of this cache whose real node runs (its kubelet is alive)."""
    for state_file in sorted(ctx.dir.parent.glob("*/state.json")):
        if state_file.parent.name == ctx.name:
            continue
        try:
            other = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if pid_alive((other.get("real_node") or {}).get("kubelet_pid")):
            return state_file.parent.name
    return None


def start_real_node(ctx: Ctx, state: dict[str, Any]) -> None:
    missing = preflight()
    if missing:
        raise HarnessError("real node", "the host lacks " + "; ".join(missing))
    other = real_node_elsewhere(ctx)
    if other is not None:  # the bridge, the node's name and ports, the iptables chains are the machine's
        raise HarnessError(
            "real node",
            f"cluster {other} runs this machine's real node; one machine runs one: "
            f"`devcluster.py down --name {other}` first",
        )
    t0 = time.monotonic()
    bins = ensure_real_node_built()
    p = node_paths(ctx)
    for d in (p.dir, p.cni_conf_dir, p.kubelet_root, p.containerd_root, p.run_dir):
        d.mkdir(parents=True, exist_ok=True)
    # Recorded first, so a failed `up` tears down whatever of the node it got to.
    node = state.setdefault("real_node", {"name": NODE_NAME, "dir": str(p.dir), "socket": str(p.socket)})
    save_state(ctx, state)
    setup_network()
    (p.cni_conf_dir / "10-rljob.conflist").write_text(cni_conflist(p))
    toml = p.dir / "containerd.toml"
    toml.write_text(containerd_toml(p))
    sysctls = p.dir / "sysctl"
    sysctls.mkdir(exist_ok=True)
    binds = []
    for key, value in KERNEL_DEFAULTS.items():
        f = sysctls / key.replace("/", "_")
        f.write_text(value + "\n")
        binds.append(f"mount --bind {f} /proc/sys/{key}")
    # containerd in a private mount namespace where the kubelet's kernel settings hold.
    script = " && ".join([*binds, f"exec containerd --config {toml}"])
    env = ctx.env()
    proc = spawn(
        ["unshare", "-m", "--propagation", "private", "--fork", "sh", "-c", script],
        ctx.logs / "containerd.log",
        env,
    )
    node["containerd_pid"] = proc.pid
    save_state(ctx, state)
    wait_for(
        "containerd",
        lambda: ctr(p, "version", timeout=5).returncode == 0,
        60,
        ctx.logs / "containerd.log",
        proc,
    )
    containerd = next((pid for pid in pids_matching(str(toml)) if "containerd --config" in _cmd(pid)), None)
    if containerd is None:
        raise HarnessError("real node", "containerd is not running", ctx.logs / "containerd.log")
    import_image(p, node_image("pause", bins["pause"], ["/pause"]), SANDBOX_IMAGE)
    import_image(p, node_image("coredns", bins["coredns"], ["/coredns"]), COREDNS_IMAGE)

    kubelet_port, kubelet_healthz, proxy_healthz, proxy_metrics = free_ports(4)
    resolv = p.dir / "resolv.conf"
    resolv.write_text("# the dev cluster has no upstream resolver: cluster names only (CoreDNS)\n")
    pki = ctx.kwok_cluster_dir / "pki"
    conf = kubelet_config(
        p, port=kubelet_port, healthz_port=kubelet_healthz, client_ca=pki / "ca.crt", resolv_conf=resolv
    )
    (p.dir / "kubelet.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
    kubelet = spawn(
        [
            "nsenter",
            f"--mount=/proc/{containerd}/ns/mnt",
            "--",
            str(bins["kubelet"]),
            f"--config={p.dir / 'kubelet.yaml'}",
            f"--kubeconfig={ctx.kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            f"--root-dir={p.kubelet_root}",
            f"--cert-dir={p.dir / 'kubelet-pki'}",
            f"--node-labels={labels}",
            "--v=1",
        ],
        ctx.logs / "kubelet.log",
        env,
    )
    node.update(kubelet_pid=kubelet.pid, kubelet_port=kubelet_port, kubelet_healthz=kubelet_healthz)
    save_state(ctx, state)
    wait_for(
        f"node {NODE_NAME} Ready",
        lambda: node_ready(ctx),
        120,
        ctx.logs / "kubelet.log",
        kubelet,
    )
    (p.dir / "kube-proxy.yaml").write_text(
        yaml.safe_dump(
            kube_proxy_config(ctx.kubeconfig, healthz_port=proxy_healthz, metrics_port=proxy_metrics)
        )
    )
    proxy_cmd = [str(bins["kube-proxy"]), f"--config={p.dir / 'kube-proxy.yaml'}"]
    _serve_until_healthy(ctx, state, "kube-proxy", proxy_cmd, proxy_healthz, env)
    (router_healthz,) = free_ports(1)
    router_cmd = [str(bins["kube-router"]), *kube_router_args(ctx.kubeconfig, health_port=router_healthz)]
    _serve_until_healthy(ctx, state, "kube-router", router_cmd, router_healthz, env)
    doc = yaml.safe_dump_all(coredns_manifests(), sort_keys=False)
    ctx.kubectl("apply", "--server-side", "--field-manager=devcluster", "-f", "-", input=doc)
    wait_for(
        "CoreDNS available",
        lambda: (
            ctx.kubectl(
                "-n",
                "kube-system",
                "wait",
                "deploy/coredns",
                "--for=condition=Available",
                "--timeout=5s",
                check=False,
                timeout=20,
            ).returncode
            == 0
        ),
        120,
        ctx.logs / "kubelet.log",
    )
    log(
        f"real node {NODE_NAME} ready in {time.monotonic() - t0:.0f} s"
        " (kubelet, containerd, kube-proxy, kube-router, CoreDNS)"
    )


def _serve_until_healthy(
    ctx: Ctx, state: dict[str, Any], name: str, cmd: list[str], healthz_port: int, env: dict[str, str]
) -> None:
    """Start one of the node's host daemons, record its pid and probe in the state (`down` stops it
    by them), and wait until its /healthz answers."""
    proc = spawn(cmd, ctx.logs / f"{name}.log", env)
    key = name.replace("-", "_")
    healthz = f"http://127.0.0.1:{healthz_port}/healthz"
    state["real_node"].update({f"{key}_pid": proc.pid, f"{key}_healthz": healthz})
    save_state(ctx, state)
    wait_for(name, lambda: http_get(healthz)[0] == 200, 60, ctx.logs / f"{name}.log", proc)


def node_ready(ctx: Ctx) -> bool:
    proc = ctx.kubectl("get", "node", NODE_NAME, "-o", "json", check=False, timeout=10)
    if proc.returncode != 0:
        return False
    conditions = json.loads(proc.stdout).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_real_node(ctx: Ctx, state: dict[str, Any]) -> None:
    """Stops the kubelet, every container, containerd, kube-proxy and kube-router; removes the node's
    network."""
    node = state.get("real_node")
    if not node:
        return
    p = node_paths(ctx)
    for key, marker, what in (
        ("kubelet_pid", "kubelet", "kubelet"),
        ("kube_proxy_pid", "kube-proxy", "kube-proxy"),
        ("kube_router_pid", "kube-router", "kube-router"),
    ):
        pid = node.get(key)
        if pid:
            stop_pid(int(pid), marker, what, grace=10)
    if p.socket.exists():
        tasks = ctr(p, "tasks", "ls", "-q", timeout=30).stdout.split()
        for task in tasks:
            ctr(p, "tasks", "kill", "--all", "--signal", "SIGKILL", task, timeout=30)
        time.sleep(1)
        for task in tasks:
            ctr(p, "tasks", "delete", "--force", task, timeout=30)
    for pid in pids_matching(str(p.socket)):  # containerd's shims name the socket
        stop_pid(pid, str(p.socket), "containerd shim", grace=5)
    pid = node.get("containerd_pid")
    if pid and pid_alive(int(pid)):
        stop_pid(int(pid), "unshare", "containerd", grace=15)
    for pid in pids_matching(str(p.dir / "containerd.toml")):
        stop_pid(pid, "containerd", "containerd", grace=10)
    proxy = next(b.path for b in real_node_binaries() if b.name == "kube-proxy")
    if proxy.exists():  # removes the Services' iptables rules
        subprocess.run([str(proxy), "--cleanup"], capture_output=True, check=False, timeout=60)
    teardown_network()
    shutil.rmtree(p.run_dir, ignore_errors=True)
    log(f"stopped the real node {NODE_NAME}")
