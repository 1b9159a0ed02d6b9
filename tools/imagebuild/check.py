"""Checks run inside a built image, as the pods run it: UID 65532, a read-only root filesystem with no
writable /tmp, and no network. Each check is one command; a failing one prints what it printed."""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe import Recipe

# podman on a host whose root lacks CAP_SYS_RESOURCE (hard nofile limit 20000): podman's default
# ulimits would be refused; crun does not run on hybrid cgroup hierarchies, runc does.
PODMAN_RUN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm"]
PODMAN_RUN += ["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=16384:16384"]
POD_LIKE = ["--user", "65532:65532", "--read-only", "--read-only-tmpfs=false", "--network", "none"]


@dataclass(frozen=True)
class Check:
    what: str
    argv: tuple[str, ...]


COMMON = (Check("pip check", ("pip", "check")),)
CHECKS: dict[str, tuple[Check, ...]] = {
    "operator": (
        *COMMON,
        Check("rljob-operator --help", ("rljob-operator", "--help")),
        Check(
            "imports",
            (
                "python3",
                "-c",
                "import kopf, kubernetes_asyncio, prometheus_client, rljob_operator.handlers, "
                "rljob_operator.reconcile\nimport importlib.util as u\n"
                "assert u.find_spec('rljob_runtime') is None, 'the runtime is in the operator image'\n"
                "assert u.find_spec('kubernetes') is None, 'the synchronous kubernetes client is installed'",
            ),
        ),
    ),
    "runtime-cpu": (
        *COMMON,
        Check("rljob-runtime --help", ("rljob-runtime", "--help")),
        Check("ray --version", ("ray", "--version")),
        Check(
            "imports",
            (
                "python3",
                "-c",
                "import ray, torch, transformers, sglang_router, rljob_runtime.cli, rljob_runtime.driver\n"
                "import rljob_runtime.rollout.hf_server, rljob_runtime.trainer.torch_backend\n"
                "assert float((torch.ones(2, 2) @ torch.ones(2, 2)).sum()) == 8.0",
            ),
        ),
    ),
}


@dataclass(frozen=True)
class Result:
    check: Check
    ok: bool
    output: str


def archive_image_id(archive: Path) -> str:
    """The image ID (its config's digest) of a one-image OCI archive, read without unpacking it."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert member is not None, f"{archive}: no blob {digest}"
            return dict(json.load(member))

        index_file = tar.extractfile("index.json")
        assert index_file is not None, f"{archive}: not an OCI archive"
        manifest = blob(json.load(index_file)["manifests"][0]["digest"])
        return str(manifest["config"]["digest"]).removeprefix("sha256:")


def ensure_loaded(recipe: Recipe, archive: Path) -> None:
    """The archive's image in containers-storage under its reference: loaded unless the image there
    already is this one (the build leaves it there; loading a multi-GB archive takes minutes)."""
    have = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", recipe.ref],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if have != archive_image_id(archive):
        subprocess.run(["podman", "load", "-q", "-i", str(archive)], check=True, capture_output=True)


def run_checks(recipe: Recipe, archive: Path) -> list[Result]:
    """Runs each check in the archive's image (loaded into containers-storage when needed)."""
    ensure_loaded(recipe, archive)
    results = []
    for check in CHECKS[recipe.name]:
        proc = subprocess.run(
            [*PODMAN_RUN, *POD_LIKE, "--entrypoint", check.argv[0], recipe.ref, *check.argv[1:]],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        results.append(Result(check, proc.returncode == 0, proc.stdout + proc.stderr))
    return results
