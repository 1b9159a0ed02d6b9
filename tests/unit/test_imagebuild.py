"""The daemonless image build (tools/imagebuild): one recipe for Docker users and for this harness,
and a cache named by every input of an image."""

from __future__ import annotations

import shutil
from pathlib import Path

import locks
import pytest
from imagebuild import recipe

from rljob_api import images

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_projects() -> None:
    assert recipe.VERSION == images.VERSION


@pytest.mark.parametrize("name", sorted(recipe.RECIPES))
def test_each_image_starts_from_the_base_and_installs_its_own_lock_only(name: str) -> None:
    """The same Dockerfile runs on the published base (docker build) and on the Debian-built base
    (make images): BASE is its only FROM, and the only lock it installs is its own."""
    r = recipe.RECIPES[name]
    steps = recipe.instructions(r.dockerfile.read_text())
    froms = [args for keyword, args in steps if keyword == "FROM"]
    assert froms == ["${BASE}"], f"{name}: FROM {froms}"
    copied_locks = [s for s in recipe.copied_sources(r.dockerfile.read_text()) if s.endswith(".lock")]
    assert copied_locks == [f"images/{name}/requirements.lock"]
    lock = next(lk for lk in locks.LOCKS if lk.name == name)
    assert lock.python == locks.PYTHON_VERSION, "the base's python3 is the Python of every lock it installs"


def test_both_ways_of_making_the_base_install_the_same_packages() -> None:
    """images/base/Dockerfile installs every name of packages.txt; mmdebstrap gets the same names."""
    dockerfile = (ROOT / "images" / "base" / "Dockerfile").read_text()
    assert recipe.copied_sources(dockerfile) == ["images/base/packages.txt"]
    assert "debian:trixie-slim" in dockerfile and recipe.DEBIAN_SUITE == "trixie"
    names = recipe.packages([(ROOT / "images" / "base" / "packages.txt").read_text()])
    assert {"python3", "python3-venv", "ca-certificates", "wget"} <= set(names)


def test_debian_trixie_python_is_the_locks_python() -> None:
    # Debian 13 (trixie) ships CPython 3.13 as python3; a suite change must move the locks with it.
    assert {"trixie": "3.13"}[recipe.DEBIAN_SUITE] == locks.PYTHON_VERSION


def test_package_lists_ignore_comments() -> None:
    assert recipe.packages(["# a\npython3\n  wget  # probes\n\n"]) == ["python3", "wget"]


def _copy_repo_subset(tmp: Path) -> Path:
    for rel in ("images", "api", "operator", "runtime"):
        shutil.copytree(ROOT / rel, tmp / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / rel, tmp / rel)
    return tmp


def test_image_hash_follows_exactly_the_copied_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy_repo_subset(tmp_path)
    monkeypatch.setattr(recipe, "IMAGES_DIR", root / "images")
    monkeypatch.setattr(recipe, "BASE_DIR", root / "images" / "base")
    op, rt = recipe.RECIPES["operator"], recipe.RECIPES["runtime-cpu"]
    before = recipe.image_hash(op, root), recipe.image_hash(rt, root)
    # A file the operator image copies: its hash moves, the runtime's does not.
    (root / "operator" / "rljob_operator" / "status.py").write_text("# changed\n", encoding="utf-8")
    assert recipe.image_hash(op, root) != before[0]
    assert recipe.image_hash(rt, root) == before[1]
    # Bytecode is outside the build context (.dockerignore): no rebuild for it.
    op_now = recipe.image_hash(op, root)
    (root / "api" / "rljob_api" / "__pycache__").mkdir(exist_ok=True)
    (root / "api" / "rljob_api" / "__pycache__" / "x.cpython-313.pyc").write_bytes(b"\0")
    assert recipe.image_hash(op, root) == op_now
    # The base's package list moves every image.
    (root / "images" / "base" / "packages.txt").write_text(
        "python3\npython3-venv\nca-certificates\nwget\ncurl\n"
    )
    assert recipe.image_hash(op, root) != op_now


def test_context_files_expand_directories_and_skip_bytecode(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("")
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_text("")
    (tmp_path / "pkg" / "x.egg-info").mkdir()
    (tmp_path / "pkg" / "x.egg-info" / "PKG-INFO").write_text("")
    (tmp_path / "top.txt").write_text("")
    assert recipe.context_files(["pkg/", "top.txt"], tmp_path) == [Path("pkg/a.py"), Path("top.txt")]
