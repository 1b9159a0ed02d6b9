"""Generate the images' lock files from pyproject.toml, or check that they are current.

    python tools/locks.py              # make locks: rewrite images/*/requirements.lock
    python tools/locks.py --upgrade    # the same, re-resolving every package to its newest allowed version
    python tools/locks.py --check      # make locks-check: fail when a lock is stale or does not resolve

Each lock is ``uv pip compile`` of pyproject.toml (its base dependencies and the image's extras) plus
images/<name>/requirements.in, for the image's Python and glibc, with hashes and wheels only. uv keeps
the versions already in the lock unless --upgrade, so --check fails only when pyproject.toml or a
requirements.in asks for something the lock does not hold, not when PyPI has a newer release.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Debian trixie's python3, the Python of images/base (both ways of making it).
PYTHON_VERSION = "3.13"
# The CUDA runtime image stays on the vendor image's Python 3.12: sglang 0.5.16 needs outlines-core
# 0.1.26, which has no Python 3.13 wheel, and Debian has no Python 3.12.
CUDA_PYTHON_VERSION = "3.12"
COMPILE_COMMAND = "make locks"  # written into each lock's header instead of the long uv command


@dataclass(frozen=True)
class Lock:
    name: str  # images/<name>/
    extras: tuple[str, ...]
    # The base image's glibc decides which manylinux wheels run on it.
    platform: str
    python: str = PYTHON_VERSION

    @property
    def dir(self) -> Path:
        return ROOT / "images" / self.name

    @property
    def path(self) -> Path:
        return self.dir / "requirements.lock"


LOCKS = (
    # images/base is Debian trixie (glibc 2.41); 2_28 keeps the operator's lock valid on bookworm too.
    Lock("operator", ("operator",), "x86_64-manylinux_2_28"),
    # sglang 0.5.16 ships manylinux_2_34 wheels only.
    Lock("runtime", ("runtime", "gpu", "megatron"), "x86_64-manylinux_2_39", CUDA_PYTHON_VERSION),
    Lock("runtime-cpu", ("runtime",), "x86_64-manylinux_2_39"),
)


def uv_binary() -> str:
    try:
        from uv import find_uv_bin  # the `uv` wheel of pyproject's dev extra
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            sys.exit("uv is not installed: make venv (pyproject.toml's dev extra installs it)")
        return found
    return find_uv_bin()


def compile_lock(lock: Lock, out: Path, *, upgrade: bool) -> subprocess.CompletedProcess[str]:
    """Write ``out``; an existing ``out`` is the set of versions uv prefers to keep."""
    cmd = [uv_binary(), "pip", "compile", "--quiet", "--no-config", "pyproject.toml"]
    cmd += [str(lock.dir.relative_to(ROOT) / "requirements.in")]
    for extra in lock.extras:
        cmd += ["--extra", extra]
    cmd += ["--python-version", lock.python, "--python-platform", lock.platform]
    cmd += ["--generate-hashes", "--only-binary", ":all:", "--custom-compile-command", COMPILE_COMMAND]
    cmd += ["--output-file", str(out)]
    if upgrade:
        cmd.append("--upgrade")
    # --python-version only sets the markers to resolve for: never fetch an interpreter for it.
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def body(text: str) -> list[str]:
    """The lock's lines after its header comment (which names the command, not the content)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return lines[start:]


def pins(lines: list[str]) -> list[str]:
    """``name==version`` lines: what a reader of a diff wants, without the hashes."""
    return [line.removesuffix(" \\") for line in lines if line[:1].isalnum()]


def where(lock: Lock) -> str:
    return f"Python {lock.python} on {lock.platform}"


def generate(lock: Lock, *, upgrade: bool) -> bool:
    t0 = time.monotonic()
    result = compile_lock(lock, lock.path, upgrade=upgrade)
    if result.returncode != 0:
        print(f"{lock.path.relative_to(ROOT)}: does not resolve for {where(lock)}:\n{result.stderr}")
        return False
    n = len(pins(body(lock.path.read_text())))
    print(f"{lock.path.relative_to(ROOT)}: {n} packages ({time.monotonic() - t0:.1f} s)")
    return True


def check(lock: Lock) -> bool:
    rel = lock.path.relative_to(ROOT)
    if not lock.path.exists():
        print(f"{rel} is missing: run make locks")
        return False
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "requirements.lock"
        shutil.copyfile(lock.path, out)  # uv keeps these versions where the inputs still allow them
        result = compile_lock(lock, out, upgrade=False)
        if result.returncode != 0:
            print(f"{rel}: its inputs do not resolve for {where(lock)}:\n{result.stderr}")
            return False
        want, have = body(out.read_text()), body(lock.path.read_text())
    if want == have:
        print(f"{rel} is up to date")
        return True
    print(
        f"{rel} is stale: it differs from what pyproject.toml and {rel.parent}/requirements.in resolve to; run make locks"
    )
    diff = list(difflib.unified_diff(pins(have), pins(want), "lock", "inputs", lineterm="", n=0))
    print("\n".join(diff[:60]) if diff else "(the same versions: hashes or annotations differ)")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail when a lock is stale or does not resolve")
    mode.add_argument("--upgrade", action="store_true", help="re-resolve every package to its newest version")
    args = parser.parse_args(argv)
    ok = [check(lock) if args.check else generate(lock, upgrade=args.upgrade) for lock in LOCKS]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
