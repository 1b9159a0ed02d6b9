"""`make demo` / `make demo-down`: set up what is missing, apply the CPU GRPO demo job, watch it.

The job runs in real pods: the images are built here (tools/imagebuild), the local control plane has
a real node (a kubelet and containerd of this machine), the operator is installed by its Helm chart,
and KubeRay starts the job's Ray head and worker pods from the runtime-cpu image.

Idempotent: a second `make demo` reuses the running control plane and operator, and attaches to a
demo job that is still running instead of applying it again (a finished one is replaced by a new
run). Setup steps are serialised by a file lock, so two concurrent runs cannot both apply.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from . import curve, inpods, manifest, nodesetup, prereqs, runs
from .kube import Kubectl, KubectlError
from .watch import TERMINAL, Snapshot, View, clock

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "tools" / "devcluster" / "devcluster.py"
CACHE = Path(os.environ.get("RLJOB_CACHE", Path.home() / ".cache" / "rljob"))
JOB_NAME = "grpo-cpu-demo"
# Not the tests' rljob-dev: that one has no real node (its CPU pods are kwok stand-ins).
DEFAULT_CLUSTER = "rljob-demo"


class DemoError(RuntimeError):
    """Something the user has to act on; the message says what."""


@dataclass(frozen=True)
class Settings:
    cluster: str
    namespace: str
    ttl_seconds: int | None
    timeout_s: float
    poll_s: float
    keep_runs: int = runs.KEEP_RUNS

    @property
    def state_dir(self) -> Path:
        return CACHE / "demo" / self.cluster


# ---- output ---------------------------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def done(what: str, detail: str) -> None:
    say(f"  ✓ {what:<28} {detail}")


def home(path: Path | str) -> str:
    """Paths under $HOME shown with ~ (shorter lines, same meaning in a shell)."""
    text = str(path)
    h = str(Path.home())
    return "~" + text[len(h) :] if text.startswith(h + "/") else text


# ---- setup steps ----------------------------------------------------------------------------------


@contextlib.contextmanager
def setup_lock(settings: Settings) -> Iterator[None]:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / "setup.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            say(f"  … another `make demo` (pid {holder}) is setting up; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def devcluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEVCLUSTER), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def cluster_up(settings: Settings) -> Kubectl:
    status = devcluster("status", "--json", f"--name={settings.cluster}", timeout=120)
    running = status.returncode == 0 and (json.loads(status.stdout).get("state") or {}).get("real_node")
    if running:
        detail = "running: reused"
    else:
        log = settings.state_dir / "cluster-up.log"
        if not prereqs.binaries_cached():
            say(
                "  … building the control plane from Go modules (once: about 12 minutes on 2 cores; "
                f"progress: tail -f {home(log)})"
            )
        t0 = time.monotonic()
        log.write_text("")
        nodesetup.cluster_up(settings.cluster, log)
        detail = f"started in {time.monotonic() - t0:.0f} s"
        status = devcluster("status", "--json", f"--name={settings.cluster}", timeout=120)
        if status.returncode != 0:
            raise DemoError(
                f"the local control plane started but is not healthy:\n{status.stdout}{status.stderr}"
            )
    state = json.loads(status.stdout)["state"]
    done(f"control plane {settings.cluster}", f"{detail} (Kubernetes, a real node, KubeRay)")
    return Kubectl(Path(state["kubectl"]), Path(state["kubeconfig"]))


def build_images(settings: Settings) -> dict[str, Path]:
    log = settings.state_dir / "images.log"
    log.write_text("")
    t0 = time.monotonic()
    say(f"  … the operator and runtime-cpu images (built daemonless when changed; tail -f {home(log)})")
    archives = nodesetup.image_archives(log)
    took = time.monotonic() - t0
    done("images", f"{'built' if took > 30 else 'cached'}: {', '.join(a.name for a in archives.values())}")
    return archives


def load_images(settings: Settings, archives: dict[str, Path]) -> None:
    t0 = time.monotonic()
    nodesetup.load_images(settings.cluster, archives, settings.state_dir / "images.log")
    done("images on the node", f"in containerd ({time.monotonic() - t0:.0f} s)")


def install_crds(kubectl: Kubectl) -> None:
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    wait_established(kubectl, "rltrainingjobs.rljob.dev")
    done("CRD rltrainingjobs.rljob.dev", "applied (server-side)")


ESTABLISHED = '{.status.conditions[?(@.type=="Established")].status}'


def wait_established(kubectl: Kubectl, crd: str, timeout: float = 60) -> None:
    """Polls the condition: `kubectl wait --for=condition=Established` fails outright ("accessor
    error: <nil>") on a CRD whose status the API server has not written yet."""
    deadline = time.monotonic() + timeout
    while kubectl.run("get", f"crd/{crd}", "-o", f"jsonpath={ESTABLISHED}", check=False).strip() != "True":
        if time.monotonic() > deadline:
            raise DemoError(f"CRD {crd} is not Established after {timeout:.0f} s: kubectl describe crd {crd}")
        time.sleep(0.5)


def ensure_operator(settings: Settings, kubectl: Kubectl, archive: Path) -> None:
    t0 = time.monotonic()
    nodesetup.install_operator(kubectl, archive, settings.state_dir / "operator.log")
    done(
        "operator",
        f"helm release {inpods.OPERATOR_RELEASE} in {inpods.OPERATOR_NAMESPACE} ({time.monotonic() - t0:.0f} s; "
        f"log: kubectl logs -n {inpods.OPERATOR_NAMESPACE} deploy/{inpods.OPERATOR_RELEASE})",
    )


def ensure_data(settings: Settings, kubectl: Kubectl, example: dict[str, Any]) -> None:
    """The model (converted on this machine once) and the data files on the data volume; the volumes
    and their claims in the demo's namespace."""
    from rljob_runtime.models.resolve import resolve_model

    t0 = time.monotonic()
    model = resolve_model(example["spec"]["model"]["path"])
    data_dir = settings.state_dir / "volumes" / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    nodesetup.fill_data(data_dir, model, example)
    runs_dir = settings.state_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    nodesetup.restricted_namespace(kubectl, settings.namespace)
    nodesetup.apply_volumes(kubectl, settings.namespace, data_dir, runs_dir)
    nodesetup.wait_bound(kubectl, settings.namespace)
    done(
        "model and data",
        f"on volume {inpods.data_claim(settings.namespace)} ({home(data_dir)}, {time.monotonic() - t0:.0f} s)",
    )


def job_phase(job: dict[str, Any] | None) -> str:
    return str(((job or {}).get("status") or {}).get("phase") or "")


def run_dir_of(settings: Settings, job: dict[str, Any]) -> Path:
    """The run directory of a demo job on this machine: its checkpoints' subPath on the runs volume
    is `<run>/checkpoints` (inpods.job_in_pods)."""
    sub_path = job["spec"]["checkpoint"]["volume"]["subPath"]
    return settings.state_dir / "runs" / Path(sub_path).parent


def apply_job(settings: Settings, kubectl: Kubectl, example: dict[str, Any]) -> tuple[Path, bool]:
    """Apply a new run, or attach to the one running. Returns (run directory, attached)."""
    existing = kubectl.get("rljob", JOB_NAME, settings.namespace)
    if existing and job_phase(existing) not in TERMINAL:
        done(
            f"job {settings.namespace}/{JOB_NAME}",
            f"already running ({job_phase(existing) or 'new'}): watching it",
        )
        return run_dir_of(settings, existing), True
    if existing:
        kubectl.run("delete", "rljob", JOB_NAME, "-n", settings.namespace, "--wait=true", "--timeout=120s")
        say(f"  … the previous demo run ended {job_phase(existing)}; starting a new run")
    runs_dir = settings.state_dir / "runs"
    removed, freed = runs.prune(runs_dir, settings.keep_runs - 1)
    if removed:
        say(
            f"  … removed {len(removed)} earlier run(s) under {home(runs_dir)} ({runs.human(freed)}); "
            f"--keep-runs N keeps the newest N"
        )
    run_dir = runs_dir / datetime.now().strftime("%Y%m%d-%H%M%S")
    nodesetup.run_checkpoint_dir(run_dir)
    job = inpods.job_in_pods(
        example, namespace=settings.namespace, run=run_dir.name, ttl_seconds=settings.ttl_seconds
    )
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    kubectl.run("apply", "-f", "-", input=yaml.safe_dump(job))
    done(f"job {settings.namespace}/{JOB_NAME}", f"applied ({manifest.EXAMPLE}, run {run_dir.name})")
    return run_dir, False


# ---- watch and summary ----------------------------------------------------------------------------


def snapshot(kubectl: Kubectl, namespace: str) -> Snapshot | None:
    job = kubectl.get("rljob", JOB_NAME, namespace)
    if job is None:
        return None
    table = kubectl.run("get", "rljob", JOB_NAME, "-n", namespace).splitlines()
    events = kubectl.json(
        "get", "events", "-n", namespace,
        "--field-selector", f"involvedObject.kind=RLTrainingJob,involvedObject.name={JOB_NAME}",
    )["items"]  # fmt: skip
    # Events of one second tie on their timestamps; resourceVersion orders them as they were written.
    uid = job["metadata"]["uid"]  # not the events of an earlier run of the same name
    events = [e for e in events if (e.get("involvedObject") or {}).get("uid") == uid]
    events.sort(key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "", _rv(e)))
    return Snapshot(table=table, status=job.get("status") or {}, events=events)


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def watch(settings: Settings, kubectl: Kubectl) -> Snapshot:
    say()
    say(
        f"Watching `kubectl get rljobs -n {settings.namespace}` (Ctrl-C stops watching; the job keeps running)."
    )
    say(
        f'In another shell:  eval "$(make -s demo-env)"; kubectl describe rljob {JOB_NAME} -n {settings.namespace}'
    )
    say()
    view = View()
    t0 = time.monotonic()
    last: Snapshot | None = None
    while time.monotonic() - t0 < settings.timeout_s:
        try:
            snap = snapshot(kubectl, settings.namespace)
        except KubectlError as exc:  # a blip of the API server: say so, keep watching
            say(f"{'':6} (kubectl: {exc})")
            snap = None
        if snap is None and last is not None:
            raise DemoError(f"the job {settings.namespace}/{JOB_NAME} was deleted while the demo watched it")
        if snap is not None:
            for line in view.update(snap, time.monotonic() - t0):
                say(line)
            last = snap
            if snap.phase in TERMINAL:
                return snap
        time.sleep(settings.poll_s)
    raise DemoError(
        f"the job did not finish within {clock(settings.timeout_s)}; it keeps running: "
        f"`kubectl describe rljob {JOB_NAME} -n {settings.namespace}`, the operator's log: {operator_log()}"
    )


def operator_log() -> str:
    return f"kubectl logs -n {inpods.OPERATOR_NAMESPACE} deploy/{inpods.OPERATOR_RELEASE}"


def on_this_machine(pod_path: str | None, run_dir: Path) -> Path:
    """A checkpoint path in the pods (under checkpoint.path) as this machine sees it."""
    local = run_dir / "checkpoints"
    if not pod_path:
        return local
    rel = (
        Path(pod_path).relative_to(inpods.CHECKPOINT_PATH)
        if pod_path.startswith(inpods.CHECKPOINT_PATH)
        else None
    )
    return local / rel if rel is not None else Path(pod_path)


def summary(settings: Settings, kubectl: Kubectl, final: Snapshot, run_dir: Path, started: float) -> int:
    say()
    progress = final.progress
    if final.phase != "Succeeded":
        lines = final.message.splitlines()
        shown = "\n".join(["    ...", *lines[-12:]]) if len(lines) > 12 else final.message
        say(f"✗ The demo job {final.phase} after {clock(time.monotonic() - started)}:\n{shown}")
        say(f"  events:        kubectl describe rljob {JOB_NAME} -n {settings.namespace}")
        say(f"  operator log:  {operator_log()}")
        say("  runtime log:   docs/follow-a-run.md#the-runtimes-log (while its head pod runs)")
        say('  (first: eval "$(make -s demo-env)")')
        return 1
    tb = manifest.tensorboard_dir(run_dir)
    scalars = curve.read_scalars(tb) if tb.is_dir() else {}
    result = curve.summarize(scalars)
    png = None
    if result is not None:
        png = curve.plot_rewards(
            scalars, run_dir / "reward.png", title=f"{JOB_NAME}: GRPO on SmolLM2-135M (CPU)"
        )
    say(
        f"✓ Succeeded in {clock(time.monotonic() - started)}: {result.line() if result else 'no reward logged'}"
    )
    say()
    say(f"  checkpoint    {home(on_this_machine(progress.get('lastCheckpoint'), run_dir))}")
    say(f"  TensorBoard   tensorboard --logdir {home(tb)}")
    if png is not None:
        say(f"  reward curve  {home(png)}")
    say(
        f'  events        kubectl describe rljob {JOB_NAME} -n {settings.namespace}   (after: eval "$(make -s demo-env)")'
    )
    say("  clean up      make demo-down")
    return 0


# ---- commands -------------------------------------------------------------------------------------


def cmd_up(settings: Settings) -> int:
    started = time.monotonic()
    example = yaml.safe_load((REPO / manifest.EXAMPLE).read_text())
    say(f"rljob demo: GRPO on {example['spec']['model']['path']}, learning single-digit addition on CPU")
    say()
    with setup_lock(settings):
        archives = build_images(settings)
        kubectl = cluster_up(settings)
        load_images(settings, archives)
        install_crds(kubectl)
        ensure_operator(settings, kubectl, archives["operator"])
        ensure_data(settings, kubectl, example)
        run_dir, _ = apply_job(settings, kubectl, example)
    final = watch(settings, kubectl)
    return summary(settings, kubectl, final, run_dir, started)


def cmd_down(settings: Settings, keep_cluster: bool, purge: bool) -> int:
    with setup_lock(settings):
        status = devcluster("status", "--json", f"--name={settings.cluster}", timeout=120)
        if status.returncode == 0:
            state = json.loads(status.stdout)["state"]
            kubectl = Kubectl(Path(state["kubectl"]), Path(state["kubeconfig"]))
            kubectl.run(
                "delete", "namespace", settings.namespace, "--ignore-not-found", "--timeout=300s",
                check=False, timeout=330,
            )  # fmt: skip
            nodesetup.delete_volumes(kubectl)
            done(f"namespace {settings.namespace}", "deleted (the job, its RayJob, Ray cluster and volumes)")
            uninstalled = nodesetup.uninstall_operator(kubectl)
            done(
                "operator",
                f"helm release {inpods.OPERATOR_RELEASE} "
                + ("uninstalled" if uninstalled else "was not installed"),
            )
        if not keep_cluster:
            down = devcluster("down", f"--name={settings.cluster}", timeout=600)
            if down.returncode != 0:
                raise DemoError(f"devcluster down failed:\n{down.stdout}{down.stderr}")
            done(f"control plane {settings.cluster}", "stopped")
    runs_dir = settings.state_dir / "runs"
    if purge:
        removed, freed = runs.prune(runs_dir, 0)
        done("run outputs", f"removed ({len(removed)} run(s), {runs.human(freed)})")
    elif kept := runs.list_runs(runs_dir):
        size = runs.human(sum(runs.size_bytes(run) for run in kept))
        say(
            f"Run outputs ({len(kept)} run(s), {size}) are kept under {home(runs_dir)}; "
            "`make demo-down DEMO_ARGS=--purge` removes them."
        )
    return 0


def cmd_env(settings: Settings) -> int:
    env = devcluster("env", f"--name={settings.cluster}", timeout=60)
    sys.stdout.write(env.stdout)
    if env.returncode == 0:  # kubectl is on the cluster's PATH line; ray and rljob-runtime are in .venv
        sys.stdout.write(f'export PATH={REPO / ".venv" / "bin"}:"$PATH"\n')
    else:
        sys.stderr.write(env.stderr or f"no running cluster {settings.cluster}: run make demo\n")
    return env.returncode


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rljob_demo", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "env"], nargs="?", default="up")
    parser.add_argument(
        "--cluster",
        default=os.environ.get("RLJOB_CLUSTER", DEFAULT_CLUSTER),
        help=f"local cluster name (default {DEFAULT_CLUSTER})",
    )
    parser.add_argument("--namespace", default=manifest.NAMESPACE, help="namespace of the demo job")
    parser.add_argument(
        "--ttl", type=int, default=None, help="override ttlSecondsAfterFinished of the example"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="stop watching after this many seconds")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between two looks at the job")
    parser.add_argument("--keep-cluster", action="store_true", help="down: leave the control plane running")
    parser.add_argument(
        "--keep-runs",
        type=positive_int,
        default=runs.KEEP_RUNS,
        help=f"up: keep the newest N run directories, this one included (default {runs.KEEP_RUNS})",
    )
    parser.add_argument("--purge", action="store_true", help="down: also remove the run outputs")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings(args.cluster, args.namespace, args.ttl, args.timeout, args.poll, args.keep_runs)
    try:
        if args.command == "down":
            return cmd_down(settings, args.keep_cluster, args.purge)
        if args.command == "env":
            return cmd_env(settings)
        return cmd_up(settings)
    except DemoError as exc:
        say(f"\n✗ {exc}")
        return 1
    except KeyboardInterrupt:
        say(
            "\nStopped watching. The job keeps running: `make demo` watches it again; `make demo-down` removes it."
        )
        return 130
