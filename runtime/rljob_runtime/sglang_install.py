"""The SGLang release the runtime speaks to, and whether this Python has it.

The pin is written once, in ``pyproject.toml``'s ``gpu`` extra (``sglang==0.5.16``). It is read from
the installed distribution's metadata (``Requires-Dist: sglang==...; extra == "gpu"``), or from the
source tree's ``pyproject.toml`` when rljob runs from a checkout without being installed (the GPU
kit). ``check_sglang_installed`` compares it with what ``importlib.metadata`` finds, without
importing SGLang (a heavy import that needs CUDA): ``prepare.prepare`` refuses a job with
``rollout.engine: sglang`` before Ray starts when they differ.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_PIN = re.compile(r"^\s*sglang\s*==\s*([0-9][^;\s,]*)")


class SGLangInstallError(RuntimeError):
    """SGLang is missing, or another release than the pinned one."""


def _from_metadata() -> str | None:
    try:
        requires = importlib.metadata.requires("rljob") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement, _, marker = line.partition(";")
        if _PIN.match(requirement) and "gpu" in marker:
            return requirement.strip().replace(" ", "")
    return None


def _from_pyproject(path: Path | None = None) -> str | None:
    path = path or PYPROJECT
    if not path.is_file():
        return None
    extras = tomllib.loads(path.read_text())["project"]["optional-dependencies"]
    return next((r.replace(" ", "") for r in extras.get("gpu", []) if _PIN.match(r)), None)


def sglang_requirement() -> str:
    """``sglang==X`` as the ``gpu`` extra pins it."""
    found = _from_metadata() or _from_pyproject()
    if found is None:
        raise SGLangInstallError(
            "no SGLang pin found: neither the installed rljob's metadata nor pyproject.toml's gpu extra "
            "has sglang==<version>"
        )
    return found


def pinned_sglang_version() -> str:
    match = _PIN.match(sglang_requirement())
    assert match is not None
    return match.group(1)


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang_installed() -> None:
    """Raise ``SGLangInstallError`` (one line, with the version needed) unless the pinned SGLang is
    what this Python would import."""
    pinned, found = pinned_sglang_version(), installed_sglang_version()
    hint = "pip install 'rljob[gpu]' (the runtime image has it)"
    if found is None:
        raise SGLangInstallError(
            f"rollout.engine sglang needs SGLang {pinned} in the runtime's Python; it is not installed: {hint}"
        )
    if found != pinned:
        raise SGLangInstallError(
            f"rollout.engine sglang needs SGLang {pinned} (the HTTP API and weight formats the runtime speaks); "
            f"found {found}: {hint}"
        )
