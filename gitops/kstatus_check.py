"""Runs gitops/kstatus-check: Flux's kstatus rules (and a Kustomization's healthCheckExprs) on objects.

The Go program is built once per source version into the devcluster's binary cache,
``${RLJOB_CACHE:-~/.cache/rljob}/bin/kstatus-check-<cli-utils version>-<source hash>/``, with the
devcluster's own build code (tools/devcluster/build.py).

    .venv/bin/python gitops/kstatus_check.py [--kustomization K.yaml] OBJECT.yaml...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "gitops" / "kstatus-check"
sys.path.insert(0, str(REPO / "tools" / "devcluster"))
import build as devbuild  # noqa: E402  (the devcluster's modules import each other by bare name)
from common import HarnessError  # noqa: E402


def binary() -> devbuild.Binary:
    """The cache entry: a new kstatus version or any source change gets a directory of its own."""
    gomod = (SOURCE / "go.mod").read_text()
    match = re.search(r"^\s*github.com/fluxcd/cli-utils\s+(v\S+)", gomod, re.M)
    if not match:
        raise HarnessError("kstatus-check", f"github.com/fluxcd/cli-utils is not required in {SOURCE}")
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    version = f"{match.group(1)}-{digest.hexdigest()[:12]}"
    return devbuild.Binary("kstatus-check", version, ".", installed=False, gomod=SOURCE)


def ensure_built() -> Path:
    return devbuild.ensure_one(binary())


def check(paths: list[Path], kustomization: Path | None = None) -> list[dict[str, Any]]:
    """One result per object: status and message by kstatus, exprs/exprsMessage by the healthCheckExprs."""
    cmd = [str(ensure_built())]
    if kustomization is not None:
        cmd += ["-kustomization", str(kustomization)]
    proc = subprocess.run(cmd + [str(p) for p in paths], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"kstatus-check exited {proc.returncode}: {proc.stderr.strip()}")
    return [json.loads(line) for line in proc.stdout.splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--kustomization", type=Path, help="a Flux Kustomization with spec.healthCheckExprs")
    parser.add_argument("objects", type=Path, nargs="+")
    args = parser.parse_args()
    for result in check(args.objects, args.kustomization):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
