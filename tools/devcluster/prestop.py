"""The head pod's preStop hook, for the dev cluster's stand-in pods.

In a real cluster the head container of a job's Ray cluster has a preStop hook, `rljob-runtime stop`
(operator/rljob_operator/build_pods.py): when the pod goes away (a suspended or preempted RayJob,
whose Ray cluster KubeRay deletes without stopping its Ray job; a deleted pod; a drained node) the
runtime gets SIGTERM, saves its last step and exits as preempted. Here the pods are kwok's and run no
hook, and the Ray job runs on the local Ray head: this process watches the RayJobs and, when one is
suspended while its Ray job runs, sends that job's driver (and only it, as the hook does) SIGTERM.

Started and stopped by devcluster.py with the cluster's kubeconfig; logs what it signals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runtime"))
from rljob_runtime.stop import is_train_process  # noqa: E402  (pure: no heavy imports)

# Ray's job supervisor gives the driver its job config, the submission id among the metadata.
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def submission_id(environ: dict[str, str]) -> str | None:
    """The Ray job submission id of a driver, from the environment Ray's job supervisor gave it."""
    try:
        config = json.loads(environ.get(RAY_JOB_CONFIG_ENV, ""))
    except ValueError:
        return None
    found = (config.get("metadata") or {}).get("job_submission_id") if isinstance(config, dict) else None
    return str(found) if found else None


def to_stop(rayjob: dict[str, Any]) -> str | None:
    """The Ray job whose driver gets SIGTERM: that of a suspended RayJob (KubeRay deletes its Ray
    cluster, whose head pod's hook would run), else None."""
    if not (rayjob.get("spec") or {}).get("suspend"):
        return None
    return (rayjob.get("status") or {}).get("jobId") or None


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def drivers(job_id: str, proc: Path = Path("/proc")) -> list[int]:
    """PIDs of the `rljob-runtime train` processes of Ray job `job_id` on this machine."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            if is_train_process(argv) and submission_id(_environ(int(entry.name))) == job_id:
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}\n")
    sys.stderr.flush()


def watch(kubeconfig: str) -> None:
    from kubernetes import client, config, watch

    config.load_kube_config(kubeconfig)
    api = client.CustomObjectsApi()
    signalled: set[str] = set()
    while True:
        stream = watch.Watch().stream(
            api.list_cluster_custom_object, "ray.io", "v1", "rayjobs", timeout_seconds=300
        )
        try:
            for event in stream:
                job_id = to_stop(event["object"])
                if job_id is None or job_id in signalled or event["type"] == "DELETED":
                    continue
                pids = drivers(job_id)
                if not pids:
                    continue
                meta = event["object"]["metadata"]
                for pid in pids:
                    log(
                        f"RayJob {meta['namespace']}/{meta['name']} suspended: SIGTERM to its driver {pid} ({job_id})"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                signalled.add(job_id)
        except Exception as exc:  # the API server restarting, a watch expiring: watch again
            log(f"watch ended: {exc}; watching again")
            time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    log("watching RayJobs: a suspended one's driver gets SIGTERM (the head pod's preStop hook)")
    watch(args.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
