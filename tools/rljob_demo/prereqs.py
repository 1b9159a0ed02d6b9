#!/usr/bin/env python3
"""What `make demo` needs from the machine and cannot install itself.

Run with the system Python before the virtualenv exists, so: standard library only, and syntax an
old Python 3 can still parse to print the "Python too old" message. Exit 0 when all is there, 1
with one line per missing thing (what, and how to get it) otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIN_PYTHON = (3, 11)
MIN_MEMORY_GB = 12
# .venv with torch (~6 GB), Go modules and builds (~3 GB), the images' archives and build cache
# (~5 GB), the runtime image unpacked in containerd (~7 GB), the model and a run (~2 GB).
MIN_FREE_GB_FRESH = 25
MIN_FREE_GB_WARM = 4


def go_requirement(gomod: Path) -> tuple[int, int]:
    """The `go 1.N` directive of the devcluster's wrapper module: the oldest Go that builds it."""
    match = re.search(r"^go (\d+)\.(\d+)", gomod.read_text(), re.MULTILINE)
    if not match:
        raise ValueError(f"no go directive in {gomod}")
    return int(match.group(1)), int(match.group(2))


def parse_go_version(text: str) -> tuple[int, int] | None:
    """`go version go1.26.8 linux/amd64` -> (1, 26)."""
    match = re.search(r"go(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def binaries_cached() -> bool:
    """True when every control-plane binary is already in the cache (then Go is not needed)."""
    sys.path.insert(0, str(REPO / "tools" / "devcluster"))
    try:
        from build import binaries  # stdlib only; reads the versions from the wrapper go.mod files

        return all(b.path.exists() for b in binaries())
    finally:
        sys.path.pop(0)


def find_go() -> str | None:
    for cand in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and Path(cand).exists():
            return cand
    return None


def check_python(version: tuple[int, ...]) -> list[str]:
    if tuple(version[:2]) < MIN_PYTHON:
        want = ".".join(map(str, MIN_PYTHON))
        return [
            f"Python {want}+ is needed (this is {'.'.join(map(str, version[:3]))}): install it "
            f"(Debian/Ubuntu: apt install python{want} python{want}-venv) and run `make demo PYTHON=python{want}`"
        ]
    return []


def check_venv_module() -> list[str]:
    if (REPO / ".venv" / "bin" / "python").exists():
        return []
    try:
        import ensurepip  # noqa: F401  (Debian splits it into python3-venv)
    except ImportError:
        return ["the Python venv module is missing: install it (Debian/Ubuntu: apt install python3-venv)"]
    return []


def check_go(go: str | None, version_text: str | None, need: tuple[int, int], cached: bool) -> list[str]:
    if cached:
        return []
    want = f"{need[0]}.{need[1]}"
    how = f"install Go {want}+ from https://go.dev/dl/ (or set GO=/path/to/go)"
    if go is None:
        return [f"Go is needed once, to build the local control plane (about 12 minutes on 2 cores): {how}"]
    have = parse_go_version(version_text or "")
    if have is None or have < need:
        return [f"{go} is {version_text or 'of unknown version'}; the control plane needs Go {want}+: {how}"]
    return []


def check_root(euid: int) -> list[str]:
    if euid != 0:
        return [
            "root: the demo's job runs in real pods on a kubelet, containerd and runc of this machine "
            "(docs/devcluster.md#real-node); run `make demo` as root"
        ]
    return []


def check_disk(free_gb: float, fresh: bool) -> list[str]:
    need = MIN_FREE_GB_FRESH if fresh else MIN_FREE_GB_WARM
    if free_gb < need:
        return [
            f"{free_gb:.1f} GB free on the disk holding {REPO} and ~/.cache/rljob; the demo needs {need} GB"
        ]
    return []


def check_memory(total_gb: float | None) -> list[str]:
    if total_gb is not None and total_gb < MIN_MEMORY_GB:
        return [
            f"{total_gb:.1f} GB of memory; the demo needs about {MIN_MEMORY_GB} GB (the job's pods, the control plane)"
        ]
    return []


def memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return None


def main() -> int:
    problems = check_python(sys.version_info)
    if problems:  # nothing else can be checked reliably (or installed) with this Python
        print("make demo cannot start:\n  - " + problems[0], file=sys.stderr)
        return 1
    problems += check_venv_module()
    problems += check_root(os.geteuid())
    cached = binaries_cached()
    go = find_go()
    version_text = None
    if go and not cached:
        version_text = subprocess.run([go, "version"], capture_output=True, text=True).stdout.strip()
    problems += check_go(go, version_text, go_requirement(REPO / "tools/devcluster/gomod/go.mod"), cached)
    fresh = not cached or not (REPO / ".venv" / ".installed").exists()
    problems += check_disk(shutil.disk_usage(REPO).free / 1e9, fresh)
    problems += check_memory(memory_gb())
    if problems:
        print(
            "make demo cannot start; missing:\n" + "".join(f"  - {p}\n" for p in problems),
            file=sys.stderr,
            end="",
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
