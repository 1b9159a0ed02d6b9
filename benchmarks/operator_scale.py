"""Operator scale benchmark: create N RLTrainingJobs on the local control plane and measure

  - apply -> RayJob created latency (p50/p99), from the moment each create call returned to the
    moment a watch saw the operator's RayJob;
  - KubeRay's own RayJob -> RayCluster latency in the same run;
  - the operator's CPU time and peak RSS (it runs as a child process of this script).

Jobs are CPU jobs whose pods cannot schedule (a nodeSelector no node has), so KubeRay creates the
RayClusters but never submits anything to Ray: the figures are the control plane's, not Ray's.

    make cluster-up
    .venv/bin/python benchmarks/operator_scale.py --jobs 100
    .venv/bin/python benchmarks/operator_scale.py --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from operator_process import OperatorProcess  # noqa: E402

JOB = {
    "model": {"path": "HuggingFaceTB/SmolLM2-135M-Instruct", "dtype": "float32"},
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
        for event in w.stream(
            api.list_namespaced_custom_object, "ray.io", "v1", ns, plural, timeout_seconds=5
        ):
            obj = event["object"]
            name = obj["metadata"]["labels"].get(key) if key else obj["metadata"]["name"]
            if name and name not in seen:
                seen[name] = time.monotonic()
            if stop.is_set():
                break


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, peak RSS bytes) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    hwm = next(
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM")
    )
    return ticks / 100.0, int(hwm.split()[1]) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--kubeconfig", default=None, help="default: the dev cluster's (devcluster.py env)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--keep", action="store_true", help="leave the namespace behind")
    args = parser.parse_args()

    kubeconfig = (
        args.kubeconfig
        or json.loads(
            subprocess.run(
                [sys.executable, str(REPO / "tools/devcluster/devcluster.py"), "status", "--json"],
                capture_output=True,
                text=True,
            ).stdout
        )["state"]["kubeconfig"]
    )
    config.load_kube_config(kubeconfig)
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    operator = OperatorProcess(Path(kubeconfig), Path("/tmp"), resync_seconds=300)
    operator.start()
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
    cpu0, _ = proc_stats(operator.proc.pid)

    def create(i: int) -> None:
        name = f"job-{i:05d}"
        body = {
            "apiVersion": "rljob.dev/v1alpha1",
            "kind": "RLTrainingJob",
            "metadata": {"name": name},
            "spec": JOB,
        }
        custom.create_namespaced_custom_object("rljob.dev", "v1alpha1", ns, "rltrainingjobs", body)
        created[name] = time.monotonic()

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(args.jobs)))
    create_seconds = time.monotonic() - start
    deadline = time.monotonic() + args.timeout
    while (len(rayjobs) < args.jobs or len(clusters) < args.jobs) and time.monotonic() < deadline:
        time.sleep(0.5)
    total_seconds = time.monotonic() - start
    cpu1, peak_rss = proc_stats(operator.proc.pid)
    stop.set()
    operator.stop()

    job_latency = [rayjobs[n] - created[n] for n in created if n in rayjobs]
    cluster_latency = [clusters[n] - rayjobs[n] for n in rayjobs if n in clusters]
    report = {
        "jobs": args.jobs,
        "created_in_s": round(create_seconds, 1),
        "all_rayjobs_and_clusters_in_s": round(total_seconds, 1),
        "rayjobs_seen": len(job_latency),
        "apply_to_rayjob_p50_s": round(statistics.median(job_latency), 3) if job_latency else None,
        "apply_to_rayjob_p99_s": round(percentile(job_latency, 0.99), 3) if job_latency else None,
        "kuberay_rayjob_to_raycluster_p50_s": round(statistics.median(cluster_latency), 3)
        if cluster_latency
        else None,
        "kuberay_rayjob_to_raycluster_p99_s": round(percentile(cluster_latency, 0.99), 3)
        if cluster_latency
        else None,
        "operator_cpu_s": round(cpu1 - cpu0, 1),
        "operator_peak_rss_mib": round(peak_rss / 2**20, 1),
    }
    print(json.dumps(report, indent=2))
    if not args.keep:
        core.delete_namespace(ns)
    return 0 if len(job_latency) == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
