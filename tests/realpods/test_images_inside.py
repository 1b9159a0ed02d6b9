"""Inside each built image, as its pods run it (UID 65532, read-only root filesystem, no network):
`pip check`, the entry point's --help and the imports (tools/imagebuild/check.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGEBUILD = REPO / "tools" / "imagebuild" / "imagebuild.py"
EXPECTED = {
    "operator": ("pip check", "rljob-operator --help", "imports"),
    "runtime-cpu": ("pip check", "rljob-runtime --help", "ray --version", "imports"),
}

pytestmark = pytest.mark.realpods


@pytest.mark.parametrize("image", sorted(EXPECTED))
def test_checks_pass_inside_the_image(image: str, image_archives: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, str(IMAGEBUILD), "check", image], capture_output=True, text=True, timeout=900
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for check in EXPECTED[image]:
        assert f"[images] {image}: {check}: ok" in out, out
