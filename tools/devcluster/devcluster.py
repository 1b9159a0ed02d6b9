#!/usr/bin/env python3
"""Local Kubernetes control plane for rljob e2e tests.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from the Go module
proxy; kwok fakes nodes and pods; the real KubeRay operator runs out of cluster; RayJob entrypoints
run on a real local Ray head (CPU) reached through a small forwarding proxy (dashproxy.py).

Subcommands: build, up, down, status, env, kueue. See docs/devcluster.md.

Binaries are cached by version under ``${RLJOB_CACHE:-~/.cache/rljob}/bin/<name>-<version>/``;
cluster state (kwok workdir with certs, etcd data and component logs, our logs, kubeconfig, state
file) lives under ``${RLJOB_CACHE}/clusters/<name>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The sibling modules below are imported by name: make them importable however this file is run.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from build import binaries, ensure_built, link_farm
from common import HarnessError, log
from controlplane import create_nodes, install_kuberay_crds, start_control_plane
from kuberay import start_operator
from kueue import start_kueue, stop_kueue
from procs import file_lock
from ray_local import start_prestop, start_proxy, start_ray
from realnode import install_packages, load_images, preflight, start_real_node
from state import Ctx, health, load_state, make_ctx, save_state
from teardown import teardown

DEFAULT_CLUSTER = "rljob-dev"


def cmd_build(args: argparse.Namespace) -> int:
    ensure_built(verbose=True)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        bins = ensure_built()
    except HarnessError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    ctx = make_ctx(args.name, bins)
    if args.real_node and args.install_deps:
        install_packages()
    missing = preflight() if args.real_node else []
    if missing:
        print(f"devcluster: cannot start a real node: the host lacks {'; '.join(missing)}", file=sys.stderr)
        return 1
    with file_lock(ctx.dir.parent / f".{ctx.name}.lock"):
        state = load_state(ctx)
        if state is not None and bool(state.get("real_node_requested")) != args.real_node:
            if not args.recreate:
                have = "with" if state.get("real_node_requested") else "without"
                print(
                    f"devcluster: cluster {ctx.name} runs {have} a real node; `down` it first or pass --recreate",
                    file=sys.stderr,
                )
                return 1
            log(f"cluster {ctx.name}: recreating it {'with' if args.real_node else 'without'} a real node")
            teardown(ctx, state)
            state = None
        if state is not None:
            h = health(ctx, state)
            if all(v == "ok" for v in h.values()):
                log(f"cluster {ctx.name} is already running: reusing it ({ctx.state_file})")
                if args.kueue:
                    start_kueue(ctx, state)
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
            "real_node_requested": args.real_node,
        }
        save_state(ctx, state)
        try:
            start_control_plane(ctx, state)
            state["nodes"] = create_nodes(ctx, gpu_pools_only=args.real_node)
            if args.real_node:
                start_real_node(ctx, state)
            install_kuberay_crds(ctx)
            start_ray(ctx, state, args.ray_cpus)
            start_proxy(ctx, state)
            start_prestop(ctx, state)
            start_operator(ctx, state)
            if args.kueue:
                start_kueue(ctx, state)
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
    if "kueue" in state:
        kueue = state["kueue"]
        print(
            f"  kueue:          {kueue['version']}, manages namespaces labelled {kueue['managed_namespace_label']}"
        )
    print(f"  logs:           {ctx.logs}  (control plane: {ctx.kwok_cluster_dir / 'logs'})")
    print(f'  shell:          eval "$({sys.executable} {Path(__file__)} env --name {ctx.name})"')


def cmd_kueue(args: argparse.Namespace) -> int:
    """Starts Kueue on the running cluster (or reuses it), or stops it with --stop."""
    ctx = make_ctx(args.name)
    with file_lock(ctx.dir.parent / f".{ctx.name}.lock"):
        state = load_state(ctx)
        if state is None or not state.get("ready"):
            print(f"devcluster: cluster {ctx.name} is not running: `devcluster.py up` first", file=sys.stderr)
            return 1
        if args.stop:
            stop_kueue(ctx, state)
        else:
            start_kueue(ctx, state)
            save_state(ctx, state)
    return 0


def cmd_load_images(args: argparse.Namespace) -> int:
    """Imports OCI archives (make images) into the real node's containerd."""
    ctx = make_ctx(args.name)
    state = load_state(ctx)
    if state is None or not state.get("real_node"):
        print(f"devcluster: cluster {ctx.name} has no real node: `up --real-node` first", file=sys.stderr)
        return 1
    for ref in load_images(ctx, state, [Path(a) for a in args.archives]):
        log(f"loaded {ref} into the real node")
    return 0


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
        ("kueue", cmd_kueue, "start Kueue on the running cluster (builds it on first use); --stop stops it"),
        ("load-images", cmd_load_images, "import OCI archives (make images) into the real node's containerd"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--name", default=os.environ.get("RLJOB_CLUSTER", DEFAULT_CLUSTER))
        p.set_defaults(func=func)
        if name == "up":
            p.add_argument("--recreate", action="store_true", help="tear down an unhealthy cluster first")
            p.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs of the local Ray head")
            p.add_argument("--kueue", action="store_true", help="also run Kueue (kueue.py; off by default)")
            p.add_argument(
                "--real-node",
                action="store_true",
                help="add a real node (kubelet, containerd, kube-proxy, CoreDNS; realnode.py); root only",
            )
            p.add_argument(
                "--install-deps",
                action="store_true",
                help="with --real-node: apt-get install the Debian packages it needs when missing",
            )
        if name == "kueue":
            p.add_argument("--stop", action="store_true", help="stop Kueue and remove its webhooks")
        if name == "status":
            p.add_argument("--json", action="store_true")
        if name == "load-images":
            p.add_argument("archives", nargs="+", metavar="ARCHIVE", help="an OCI archive (oci-archive tar)")
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except HarnessError as exc:
        print(exc.report(), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
