"""The SGLang pin is read from one place, and prepare's check names the version needed."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from rljob_runtime import sglang_install
from rljob_runtime.sglang_install import SGLangInstallError, check_sglang_installed


def test_the_pin_is_pyprojects_gpu_extra() -> None:
    assert sglang_install._from_pyproject() == "sglang==0.5.16"
    assert sglang_install.pinned_sglang_version() == "0.5.16"
    from_metadata = sglang_install._from_metadata()  # the editable install's own metadata
    assert from_metadata in (None, "sglang==0.5.16")


def test_the_pin_is_found_without_an_installed_rljob(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sglang_install, "_from_metadata", lambda: None)
    assert sglang_install.sglang_requirement() == "sglang==0.5.16"
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\nname = "x"\n[project.optional-dependencies]\ngpu = ["sglang == 0.6.1"]\n')
    assert sglang_install._from_pyproject(other) == "sglang==0.6.1"
    monkeypatch.setattr(sglang_install, "PYPROJECT", tmp_path / "missing.toml")
    with pytest.raises(SGLangInstallError, match="no SGLang pin"):
        sglang_install.sglang_requirement()


def test_the_installed_release_must_be_the_pinned_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        if name != "sglang":
            raise AssertionError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    installed = "0.5.16"
    check_sglang_installed()
    installed = "0.5.23"
    with pytest.raises(SGLangInstallError, match=r"needs SGLang 0.5.16 .*found 0.5.23"):
        check_sglang_installed()

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(
        SGLangInstallError, match=r"needs SGLang 0\.5\.16 in the runtime.s Python; it is not installed"
    ):
        check_sglang_installed()


def test_prepare_refuses_a_missing_sglang_before_ray_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_runtime.prepare import check_sglang
    from rljob_runtime.run_error import RunError

    monkeypatch.setattr(sglang_install, "installed_sglang_version", lambda: None)
    with pytest.raises(RunError, match=r"needs SGLang 0\.5\.16"):
        check_sglang()
