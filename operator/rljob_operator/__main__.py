"""rljob-operator: reconcile RLTrainingJobs into KubeRay RayJobs.

rljob-operator [--namespace NS ...] [--metrics-port 8080] [--liveness http://0.0.0.0:8081/healthz]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from . import lazy_client

lazy_client.install()  # before kopf imports kubernetes_asyncio: its whole generated client otherwise

import kopf  # noqa: E402
from prometheus_client import start_http_server  # noqa: E402

from . import election  # noqa: E402
from .build import BuildSettings  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rljob-operator", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only these namespaces (repeatable); default: all",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=8080, help="Prometheus /metrics port; 0 disables (default 8080)"
    )
    parser.add_argument(
        "--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=60.0, help="reconcile every job this often (default 60)"
    )
    parser.add_argument(
        "--submission-mode",
        choices=["HTTPMode", "K8sJobMode"],
        default="HTTPMode",
        help="how KubeRay submits the runtime (default HTTPMode)",
    )
    parser.add_argument(
        "--ray-version", default=BuildSettings.ray_version, help="Ray version of the runtime image"
    )
    parser.add_argument(
        "--secret-preflight",
        action="store_true",
        help="check that referenced Secrets exist before creating a job's children (needs get secrets)",
    )
    pods = parser.add_argument_group("job pods (admin policy: jobs cannot change these)")
    pods.add_argument(
        "--allow-host-path",
        action="append",
        default=[],
        metavar="PREFIX",
        help="let jobs mount hostPath volumes below this node directory (repeatable); default: none",
    )
    pods.add_argument(
        "--gpu-capability",
        action="append",
        default=[],
        metavar="CAP",
        help="add this Linux capability to GPU containers, e.g. IPC_LOCK for RDMA (repeatable); pods then "
        "need a namespace that allows it (not Pod Security 'restricted')",
    )
    pods.add_argument(
        "--no-ray-auth",
        dest="ray_auth",
        action="store_false",
        help="leave the Ray dashboard and job API without token auth (Ray < 2.52 images)",
    )
    pods.add_argument(
        "--no-network-policy",
        dest="network_policy",
        action="store_false",
        help="create no NetworkPolicy per job",
    )
    pods.add_argument(
        "--kuberay-namespace",
        default=None,
        help="namespace of the KubeRay operator, the one peer outside a job its NetworkPolicy admits "
        "(default: KubeRay's pods in any namespace)",
    )
    parser.add_argument(
        "--kueue-manage-jobs-without-queue-name",
        action="store_true",
        help="Kueue runs with manageJobsWithoutQueueName: leave the admission of every job, also one "
        "without spec.queueName, to Kueue (no GPU-quota queue, spec.suspend of the RayJob is Kueue's)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    election.add_arguments(parser)
    return parser


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf logs "Handler 'job_event' succeeded." at INFO for every watch event: a dozen lines per job
    # while it starts, and a few percent of the operator's CPU in a burst. Its warnings and errors stay.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if verbose else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    leader_election = election.election_from_args(args, parser)
    configure_logging(args.verbose)
    from . import catch_up, handlers, kopf_toggles  # handlers registers the handlers with kopf

    kopf_toggles.install()  # before kopf starts: its start among thousands of objects was quadratic

    handlers.Options.settings = BuildSettings(
        ray_version=args.ray_version,
        submission_mode=args.submission_mode,
        secret_preflight=args.secret_preflight,
        gpu_capabilities=tuple(args.gpu_capability),
        allowed_host_paths=tuple(args.allow_host_path),
        ray_auth=args.ray_auth,
        network_policy=args.network_policy,
        kuberay_namespace=args.kuberay_namespace,
        kueue_manage_jobs_without_queue_name=args.kueue_manage_jobs_without_queue_name,
    )
    handlers.Options.resync_seconds = args.resync_seconds
    handlers.Options.namespaces = tuple(args.namespace)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    elector = None
    if leader_election is None:
        election.LEADER.set(1)
    else:  # nothing of the operator runs until this replica holds the lease (election.py)
        elector = election.Elector(leader_election, args.liveness)
        elector.start()
        elector.wait_for_leadership()
    asyncio.run(catch_up.announce_missing(handlers.Options.namespaces))
    try:
        kopf.run(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            standalone=True,
        )
    finally:
        if elector is not None:
            elector.stop()  # releases the lease once the operator has stopped
    return 0


if __name__ == "__main__":
    sys.exit(main())
