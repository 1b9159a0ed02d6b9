"""What each image is made of, and the hash of those inputs that names its cached build (pure: no I/O
beyond reading the repository's files).

An image is built from its Dockerfile on a base (images/base: Debian trixie and the packages listed
in images/base/packages*.txt). The input hash covers the Dockerfile, every file its COPY lines read
(as the build context holds them) and the base's inputs, so a cached archive is reused exactly when
a build would produce the same image.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES_DIR = ROOT / "images"
BASE_DIR = IMAGES_DIR / "base"
DEBIAN_SUITE = "trixie"
VERSION = "0.1.0"  # rljob_api.images.VERSION; tests/unit/test_imagebuild.py checks they agree
# Excluded from the build context by .dockerignore inside the allowed trees.
CONTEXT_EXCLUDES = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info")


@dataclass(frozen=True)
class Recipe:
    name: str  # images/<name>/Dockerfile
    flavour: str  # the base: "base" (images/base/packages.txt)
    in_ci: bool  # built by `make images` (and so by make test)

    @property
    def dockerfile(self) -> Path:
        return IMAGES_DIR / self.name / "Dockerfile"

    @property
    def repository(self) -> str:
        return f"rljob/{self.name}"

    @property
    def ref(self) -> str:
        """The reference pods name (containerd reads a bare name as docker.io/...)."""
        return f"docker.io/{self.repository}:{VERSION}"


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("operator", "base", True),
        Recipe("runtime-cpu", "base", True),
    )
}
# Not here yet: the CUDA runtime (images/runtime/Dockerfile) still starts from NVIDIA's CUDA image,
# which cannot be pulled without a registry. Its lock needs Python 3.12 (sglang 0.5.16 -> outlines-core
# 0.1.26 has no 3.13 wheel) and Debian ships only 3.13, so images/base cannot carry it.


def instructions(dockerfile_text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile_text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def copied_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths COPY/ADD read; copies from another stage (--from=) are not."""
    sources: list[str] = []
    for keyword, args in instructions(dockerfile_text):
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else args.split()
        if any(w.startswith("--from=") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources += paths[:-1]  # the last one is the destination
    return sources


def excluded(rel: Path) -> bool:
    return any(fnmatch.fnmatchcase(part, pat) for part in rel.parts for pat in CONTEXT_EXCLUDES)


def context_files(sources: list[str], root: Path = ROOT) -> list[Path]:
    """The files the COPY sources expand to, relative to `root`, sorted."""
    found: set[Path] = set()
    for src in sources:
        for match in root.glob(src.rstrip("/")):
            paths = [match] if match.is_file() else [p for p in match.rglob("*") if p.is_file()]
            found.update(p.relative_to(root) for p in paths if not excluded(p.relative_to(root)))
    return sorted(found)


def package_lists(flavour: str) -> list[Path]:
    if flavour != "base":
        raise ValueError(f"no base flavour {flavour!r}")
    return [BASE_DIR / "packages.txt"]


def packages(texts: list[str]) -> list[str]:
    """The package names of package-list texts (one a line, # comments)."""
    names: list[str] = []
    for text in texts:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def base_hash(flavour: str) -> str:
    """The base rootfs's inputs: the suite and its package names."""
    names = packages([p.read_text() for p in package_lists(flavour)])
    return _digest([DEBIAN_SUITE, *names])


def image_hash(recipe: Recipe, root: Path = ROOT) -> str:
    """The image's inputs: its base, its Dockerfile and every file its COPY lines read."""
    text = recipe.dockerfile.read_text()
    h = hashlib.sha256()
    h.update(base_hash(recipe.flavour).encode())
    h.update(text.encode())
    for rel in context_files(copied_sources(text), root):
        h.update(b"\0" + str(rel).encode() + b"\0")
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
