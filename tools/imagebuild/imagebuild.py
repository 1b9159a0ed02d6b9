#!/usr/bin/env python3
"""Build rljob's images without a Docker daemon, and check what is inside them.

    python3 tools/imagebuild/imagebuild.py build                 # operator + runtime-cpu (make images)
    python3 tools/imagebuild/imagebuild.py build runtime         # the CUDA runtime (make image-runtime-cuda)
    python3 tools/imagebuild/imagebuild.py check operator        # pip check, --help, imports as UID 65532
    python3 tools/imagebuild/imagebuild.py path runtime-cpu      # the cached OCI archive (built if missing)

Standard library only, so it runs before the virtualenv exists. Archives are cached under
${RLJOB_CACHE:-~/.cache/rljob}/images by the hash of their inputs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build import BuildError, build, ensure_tools
from check import run_checks
from recipe import RECIPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install-tools", action="store_true", help="apt-get install missing build tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("build", "build the images (the CI set when none is named)"),
        ("check", "build if needed, then run the in-image checks"),
        ("path", "print each image's OCI archive, building it if needed"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("images", nargs="*", metavar="IMAGE", help=f"of {', '.join(RECIPES)}")
    args = parser.parse_args(argv)
    names = args.images or [r.name for r in RECIPES.values() if r.in_ci]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        parser.error(f"unknown image {', '.join(unknown)}: choose from {', '.join(RECIPES)}")
    try:
        ensure_tools(args.install_tools)
        failed = 0
        for name in names:
            recipe = RECIPES[name]
            t0 = time.monotonic()
            archive = build(recipe)
            if args.command == "path":
                print(archive)
            elif args.command == "check":
                for result in run_checks(recipe, archive):
                    print(f"[images] {name}: {result.check.what}: {'ok' if result.ok else 'FAILED'}")
                    if not result.ok:
                        failed += 1
                        print(result.output.rstrip())
                print(f"[images] {name}: checked in {time.monotonic() - t0:.0f} s")
        return 1 if failed else 0
    except BuildError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
