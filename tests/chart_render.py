"""The Helm binary of the dev cluster's toolchain (built once, cached by version) and `helm
template` of the chart, for the chart's template tests and the e2e install tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "rljob"
KUBE_VERSION = "1.36.4"  # helm template's default cluster version is too old for the chart


def helm_binary() -> Path:
    sys.path.insert(0, str(REPO / "tools" / "devcluster"))
    from build import bin_by_name, ensure_one

    return ensure_one(bin_by_name()["helm"])  # the e2e harness builds it too; whoever comes first


def template(*args: str, namespace: str = "rljob-system") -> subprocess.CompletedProcess[str]:
    cmd = [
        str(helm_binary()),
        "template",
        "rljob",
        str(CHART),
        "-n",
        namespace,
        f"--kube-version={KUBE_VERSION}",
    ]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def render(*set_args: str, namespace: str = "rljob-system") -> list[dict[str, Any]]:
    """The chart's objects for these `--set` values; fails with helm's message."""
    proc = template(*(f"--set={v}" for v in set_args), namespace=namespace)
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
