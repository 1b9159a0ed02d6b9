"""Builds the images without a Docker daemon and without pulling a base image.

1. The base rootfs: mmdebstrap installs images/base/packages*.txt from Debian's archive into a tar,
   cached by its inputs, and podman imports it as localhost/rljob-base-<flavour>:<hash>.
2. The image: buildah (chroot isolation) runs images/<name>/Dockerfile with BASE set to that base:
   the same Dockerfile users build with Docker on images/base/Dockerfile's base.
3. The result: an OCI archive under ${RLJOB_CACHE}/images, named by the hash of every input
   (recipe.image_hash), so an unchanged image is never rebuilt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from recipe import DEBIAN_SUITE, ROOT, Recipe, base_hash, image_hash, package_lists, packages

# Debian packages the builder runs (and `make images` installs when they are missing).
# runc: podman's default OCI runtime, for the in-image checks (Debian's podman may come with crun only).
BUILD_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "podman": "podman",
    "buildah": "buildah",
    "skopeo": "skopeo",
    "runc": "runc",
}
DEBIAN_MIRROR = os.environ.get("RLJOB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Where outbound HTTPS goes through an intercepting proxy, pip inside the build needs its CA.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Archives kept per image name: the newest few, so switching between two commits does not rebuild.
KEEP_ARCHIVES = 2


class BuildError(Exception):
    """One line for a person: what failed and where its log is."""


def cache_dir() -> Path:
    root = Path(os.environ.get("RLJOB_CACHE") or Path.home() / ".cache" / "rljob").expanduser()
    return root / "images"


def log(msg: str) -> None:
    print(f"[images] {msg}", flush=True)


def missing_tools() -> list[str]:
    return sorted(pkg for tool, pkg in BUILD_TOOLS.items() if shutil.which(tool) is None)


def ensure_tools(install: bool) -> None:
    missing = missing_tools()
    if not missing:
        return
    if not install:
        raise BuildError(
            f"missing Debian packages {' '.join(missing)}: apt-get install {' '.join(missing)} "
            "(or run with --install-tools as root)"
        )
    log(f"installing {' '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def run_logged(cmd: list[str], logfile: Path, what: str, cwd: Path = ROOT) -> None:
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}); log: {logfile}")


def image_exists(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0


def base_ref(flavour: str) -> str:
    return f"localhost/rljob-base-{flavour}:{base_hash(flavour)}"


def ensure_base(flavour: str) -> str:
    """The base image in containers-storage (from the cached rootfs tar, made when missing)."""
    ref = base_ref(flavour)
    if image_exists(ref):
        return ref
    logfile = cache_dir() / "logs" / f"base-{flavour}.log"
    tar = cache_dir() / f"base-{flavour}-{base_hash(flavour)}.tar"
    if not tar.exists():
        names = packages([p.read_text() for p in package_lists(flavour)])
        log(f"base ({flavour}): mmdebstrap {DEBIAN_SUITE} with {' '.join(names)} (log: {logfile})")
        t0 = time.monotonic()
        tmp = tar.with_suffix(".part")
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(names)}", "--format=tar"]
        # Debian's docker images leave these out too: no apt lists, docs or man pages in the base.
        cmd += ["--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*"]
        cmd += ["--customize-hook=rm -rf $1/var/lib/apt/lists/*", DEBIAN_SUITE, str(tmp), DEBIAN_MIRROR]
        run_logged(cmd, logfile, f"mmdebstrap of the {flavour} base")
        tmp.rename(tar)
        log(f"base ({flavour}): rootfs in {time.monotonic() - t0:.0f} s, {tar.stat().st_size >> 20} MiB")
    run_logged(["podman", "import", str(tar), ref], logfile, f"podman import of the {flavour} base")
    return ref


def archive_path(recipe: Recipe) -> Path:
    return cache_dir() / f"{recipe.name}-{image_hash(recipe)}.oci.tar"


def build(recipe: Recipe) -> Path:
    """The image's OCI archive, built unless cached. Its reference inside is recipe.ref."""
    archive = archive_path(recipe)
    if archive.exists():
        log(f"{recipe.name}: cached ({archive})")
        return archive
    base = ensure_base(recipe.flavour)
    logfile = cache_dir() / "logs" / f"{recipe.name}.log"
    log(f"{recipe.name}: buildah bud on {base} (log: {logfile})")
    t0 = time.monotonic()
    cmd = ["buildah", "bud", "--isolation", "chroot", "--network", "host", "--pull-never", "--layers"]
    cmd += ["--build-arg", f"BASE={base}", "-f", str(recipe.dockerfile), "-t", recipe.ref]
    if HOST_CA.exists():
        cmd += ["-v", f"{HOST_CA}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
    run_logged([*cmd, "."], logfile, f"build of {recipe.name}")
    tmp = archive.with_suffix(".part")
    tmp.unlink(missing_ok=True)
    # Layers are gzipped into the archive (runtime-cpu: 6.5 GB of packages, 3.3 GB compressed).
    push = ["buildah", "push", recipe.ref, f"oci-archive:{tmp}:{recipe.ref}"]
    run_logged(push, logfile, f"export of {recipe.name}")
    tmp.rename(archive)
    prune(recipe, keep=archive)
    log(f"{recipe.name}: built in {time.monotonic() - t0:.0f} s, {archive.stat().st_size >> 20} MiB")
    return archive


def prune(recipe: Recipe, keep: Path) -> None:
    """Older archives of the same image beyond the newest KEEP_ARCHIVES."""
    mine = re.compile(rf"{re.escape(recipe.name)}-[0-9a-f]{{16}}\.oci\.tar")
    others = sorted(
        (p for p in cache_dir().glob("*.oci.tar") if mine.fullmatch(p.name) and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in others[KEEP_ARCHIVES - 1 :]:
        old.unlink(missing_ok=True)
