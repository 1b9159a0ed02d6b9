"""The command-line options the benchmark scripts share, defined once: where results go (``--json``),
where models and logs live (``--model-root``, ``--log-dir``), the device and the rollout engine on it
(``--device``, ``--engine``, ``--sglang-arg``, ``--mem-fraction``) and the timing knobs (``--steps``,
``--warmup``, ``--runs``, ``--seed``).

A script keeps its own defaults and help where they differ (each function takes them), so its flags
read as before. Standard library only: the scripts import it before the runtime is on ``sys.path``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

DEVICES = ("cuda", "cpu")
ENGINES = ("sglang", "hf")


def doc_parser(doc: str | None, *, whole: bool = False) -> argparse.ArgumentParser:
    """A script's parser described by its module docstring: the first paragraph, or the whole text as
    written (``whole``: its usage examples keep their lines)."""
    text = doc or ""
    if whole:
        return argparse.ArgumentParser(description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=text.split("\n\n")[0])


# ------------------------------------------------------------------------------------ files


def add_json(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--json PATH``: also write the results there (None: only print them)."""
    parser.add_argument("--json", type=Path, default=None, help=help)


def add_model_root(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--model-root DIR``: the model directories, written once and reused (None: a temporary one)."""
    parser.add_argument("--model-root", type=Path, default=None, help=help)


def add_log_dir(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--log-dir DIR``: the servers' and engines' logs (None: a temporary one)."""
    parser.add_argument("--log-dir", type=Path, default=None, help=help)


def dir_or_temp(path: Path | None, prefix: str) -> Path:
    """``path``, or a new temporary directory named ``prefix...`` when it is not given."""
    return path or Path(tempfile.mkdtemp(prefix=prefix))


# ------------------------------------------------------------------------- device and engine


def add_device(parser: argparse.ArgumentParser) -> None:
    """``--device cuda|cpu`` (default cuda): cpu runs the harness without a GPU."""
    parser.add_argument("--device", choices=DEVICES, default="cuda")


def add_engine(parser: argparse.ArgumentParser, help: str) -> None:
    """``--engine sglang|hf``, resolved from ``--device`` by ``resolve_engine`` when not given."""
    parser.add_argument("--engine", choices=ENGINES, default=None, help=help)


def resolve_engine(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The engine's default (sglang on cuda, hf on cpu); SGLang on CPU is refused, as it cannot run."""
    if args.engine is None:
        args.engine = "sglang" if args.device == "cuda" else "hf"
    if args.engine == "sglang" and args.device != "cuda":
        parser.error("--engine sglang needs --device cuda (on cpu: --engine hf)")


def add_mem_fraction(parser: argparse.ArgumentParser, default: float, help: str | None = None) -> None:
    """``--mem-fraction F``: the engine's ``--mem-fraction-static``."""
    parser.add_argument("--mem-fraction", type=float, default=default, help=help)


def add_sglang_arg(parser: argparse.ArgumentParser, help: str) -> None:
    """``--sglang-arg KEY=VALUE`` (repeatable): one more SGLang flag; ``sglang_flags`` reads them."""
    parser.add_argument("--sglang-arg", action="append", default=[], metavar="KEY=VALUE", help=help)


def sglang_flags(items: Sequence[str]) -> dict[str, str]:
    """``--sglang-arg`` values as SGLang flags without their dashes (``KEY=``: a bare flag)."""
    flags = {}
    for item in items:
        key, _, value = item.partition("=")
        flags[key.strip().lstrip("-")] = value
    return flags


# ------------------------------------------------------------------------------------- timing


def add_steps_and_warmup(parser: argparse.ArgumentParser, *, steps: int, warmup: int) -> None:
    """``--steps N`` timed after ``--warmup K`` untimed ones."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=warmup)


def add_runs(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    """``--runs R``: timed repeats, of which the script reports the median or the best."""
    parser.add_argument("--runs", type=int, default=default, help=help)


def add_seed(parser: argparse.ArgumentParser, default: int = 0, help: str | None = None) -> None:
    """``--seed S``: the random data and sampling of a run."""
    parser.add_argument("--seed", type=int, default=default, help=help)
