"""The container images: what the Dockerfiles copy, what their locks pin, and where their tags come from."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import locks
import pytest
import yaml
from imagebuild import recipe

from rljob_api import images
from rljob_api.spec_resources import ResourcesSpec
from rljob_operator.build import BuildSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {name: ROOT / "images" / name / "Dockerfile" for name in ("operator", "runtime-cpu", "runtime")}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    return recipe.instructions(dockerfile.read_text())


def copied_sources(dockerfile: Path) -> list[str]:
    return recipe.copied_sources(dockerfile.read_text())


def arg_default(dockerfile: Path, name: str) -> str:
    for keyword, args in instructions(dockerfile):
        if keyword == "ARG" and args.startswith(f"{name}="):
            return args.split("=", 1)[1]
    raise AssertionError(f"{dockerfile}: no ARG {name}=...")


def lock_pins(name: str) -> dict[str, str]:
    text = (ROOT / "images" / name / "requirements.lock").read_text()
    return dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", text, re.M))


def extra_pin(extra: str, package: str) -> str:
    """The version pyproject.toml pins `package` to (==) in `extra`."""
    for req in PYPROJECT["project"]["optional-dependencies"][extra]:
        m = re.fullmatch(rf"{re.escape(package)}==(\S+)", req)
        if m:
            return m.group(1)
    raise AssertionError(f"pyproject.toml's {extra} extra does not pin {package}==...")


def dockerignore_allowed() -> list[str]:
    """The paths the allow-list .dockerignore lets back into the context (its `!` lines)."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines, ".dockerignore is expected to start from `*` (an allow-list)"
    return [line[1:].rstrip("/") for line in lines if line.startswith("!")]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_every_copied_path_exists_and_is_in_the_build_context(name: str) -> None:
    sources = copied_sources(DOCKERFILES[name])
    assert sources, f"{name}: no COPY found (parser broken?)"
    allowed = dockerignore_allowed()
    for src in sources:
        rel = src.rstrip("/")
        assert list(ROOT.glob(rel)), f"images/{name}/Dockerfile copies {src}, which is not in the repository"
        assert any(fnmatch.fnmatchcase(rel, a) or rel.startswith(a + "/") for a in allowed), (
            f"images/{name}/Dockerfile copies {src}, which .dockerignore leaves out of the build context"
        )


def test_copy_parser_skips_stage_copies_and_flags(tmp_path: Path) -> None:
    df = tmp_path / "Dockerfile"
    df.write_text(
        "FROM x AS b\n# COPY commented/ out/\nCOPY --chown=1:1 a.txt \\\n  b/ /dst/\n"
        'COPY ["c d", "/e"]\nCOPY --from=b /opt /opt\nADD f /g\n'
    )
    assert copied_sources(df) == ["a.txt", "b/", "c d", "f"]


def test_runtime_lock_pins_what_the_runtime_needs() -> None:
    pins = lock_pins("runtime")
    assert pins["torch"].startswith("2.11."), "sglang 0.5.16 and the GPU machines run torch 2.11"
    assert pins["sglang"] == extra_pin("gpu", "sglang") == "0.5.16"
    assert pins["ray"] == BuildSettings().ray_version, "pods must run the Ray the operator's RayJobs name"
    assert pins["transformers"] == "5.12.1", "5.17 breaks sglang 0.5.16's config registration"
    assert pins["megatron-core"].startswith("0.16.")
    assert "sglang-router" in pins


def test_runtime_image_cuda_is_torchs() -> None:
    """The base image's CUDA is the toolkit torch's wheel requires, and the JIT compiler matches it."""
    pins = lock_pins("runtime")
    base = arg_default(DOCKERFILES["runtime"], "CUDA_IMAGE")
    m = re.match(r"nvidia/cuda:(\d+\.\d+\.\d+)-devel-ubuntu24\.04(@sha256:[0-9a-f]{64})?$", base)
    assert m, f"unexpected runtime base image {base}"
    assert pins["cuda-toolkit"] == m.group(1), "torch's cuda-toolkit and the base image disagree"
    major_minor = ".".join(m.group(1).split(".")[:2])
    for nvcc_part in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime"):
        assert pins[nvcc_part].startswith(major_minor + "."), f"{nvcc_part} {pins[nvcc_part]}"


def test_operator_lock_holds_the_operator_only() -> None:
    pins = lock_pins("operator")
    for needed in ("kopf", "kubernetes-asyncio", "prometheus-client", "pydantic", "pyyaml"):
        assert needed in pins
    assert "kubernetes" not in pins, "kopf imports the synchronous client when installed (25 MiB)"
    for runtime_only in ("torch", "ray", "sglang", "transformers", "megatron-core"):
        assert runtime_only not in pins


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_every_lock_entry_is_hashed(name: str) -> None:
    text = (ROOT / "images" / name / "requirements.lock").read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    unhashed = [b.split()[0] for b in blocks if "--hash=sha256:" not in b]
    assert not unhashed, f"pip --require-hashes would refuse images/{name}/requirements.lock: {unhashed}"


def test_images_use_the_locks_python() -> None:
    """The operator and CPU runtime install their locks on images/base (Debian trixie's python3);
    the CUDA runtime on the vendor image's python3.12 (its lock's Python)."""
    by_name = {lock.name: lock for lock in locks.LOCKS}
    assert by_name["operator"].python == by_name["runtime-cpu"].python == locks.PYTHON_VERSION == "3.13"
    for name in ("operator", "runtime-cpu"):
        assert arg_default(DOCKERFILES[name], "BASE") == f"rljob/base:{images.VERSION}"
    assert f"python{by_name['runtime'].python} " in DOCKERFILES["runtime"].read_text()


def test_runtime_requirements_pin_the_operators_ray() -> None:
    text = (ROOT / "images" / "runtime" / "requirements.in").read_text()
    assert f"ray[default]=={BuildSettings().ray_version}" in text.splitlines()


def test_runtime_image_default_is_derived_from_the_version() -> None:
    default = ResourcesSpec.model_fields["image"].default
    assert default == images.RUNTIME_IMAGE == f"{images.RUNTIME_REPOSITORY}:{images.VERSION}"
    assert default == "rljob/runtime:0.1.0"  # the goldens and the CRD carry it
    assert ResourcesSpec().image == default


def test_version_is_pyprojects() -> None:
    assert PYPROJECT["project"]["version"] == images.VERSION, "bump rljob_api/images.py with pyproject.toml"


def test_chart_app_version_is_the_version() -> None:
    chart = ROOT / "charts" / "rljob" / "Chart.yaml"
    if not chart.exists():
        pytest.skip("charts/rljob/Chart.yaml does not exist yet")
    assert str(yaml.safe_load(chart.read_text())["appVersion"]) == images.VERSION
    values = yaml.safe_load((chart.parent / "values.yaml").read_text())
    assert values["image"]["repository"] == images.OPERATOR_REPOSITORY


def test_lock_body_ignores_the_header() -> None:
    a = "# autogenerated by\n#    make locks\nkopf==1.0 \\\n    --hash=sha256:00\n    # via x\n"
    b = "# another command\nkopf==1.0 \\\n    --hash=sha256:00\n    # via x\n"
    assert locks.body(a) == locks.body(b)
    assert locks.pins(locks.body(a)) == ["kopf==1.0"]


def test_runtime_cpu_lock_holds_the_cpu_runtime_only() -> None:
    pins = lock_pins("runtime-cpu")
    for needed in ("torch", "transformers", "sglang-router", "accelerate", "gguf", "aiohttp", "kubernetes"):
        assert needed in pins, needed
    assert pins["ray"] == BuildSettings().ray_version, "pods must run the Ray the operator's RayJobs name"
    # Not the GPU image's torch 2.11 (pinned there for SGLang 0.5.16): the CPU path resolves freely.
    assert tuple(int(x) for x in pins["torch"].split(".")[:2]) >= (2, 11)
    for gpu_only in ("sglang", "megatron-core", "flashinfer-python"):
        assert gpu_only not in pins, gpu_only
