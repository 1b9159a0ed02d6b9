"""Fail on a product module over LIMIT lines that does not say why it is that long.

    python tools/long_files.py            # make lint: api/, operator/ and runtime/
    python tools/long_files.py FILE...    # only these files

A long module is usually several things at once; where it is one thing (a protocol, a CLI with its
subcommands), a line near its top says so, and that line is what a reader sees first:

    # long-file: <why this module is one piece>

The line must sit in the first REASON_WITHIN lines and give a reason (not only the marker). Every
finding prints as ``path: N lines ...`` and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("api", "operator", "runtime")
LIMIT = 500
REASON_WITHIN = 30
_REASON = re.compile(r"^\s*#\s*long-file:\s*(?P<why>\S.{9,})$")  # ten characters at least: a reason


def problem(path: Path, text: str) -> str | None:
    """What is wrong with this module's length, or None."""
    lines = text.splitlines()
    if len(lines) <= LIMIT:
        return None
    if any(_REASON.match(line) for line in lines[:REASON_WITHIN]):
        return None
    return (
        f"{path}: {len(lines)} lines (limit {LIMIT}): split it, or say why it is one piece in a "
        f"'# long-file: <reason>' line within its first {REASON_WITHIN} lines"
    )


def product_files(root: Path = ROOT) -> Iterable[Path]:
    for folder in PRODUCT:
        yield from sorted((root / folder).rglob("*.py"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    files = args.files or [f.relative_to(ROOT) for f in product_files()]
    found = [p for f in files if (p := problem(f, (ROOT / f).read_text())) is not None]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
