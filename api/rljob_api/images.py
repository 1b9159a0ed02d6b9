"""The container images this project builds (images/*/Dockerfile) and the one place their tags come from.

Each image is tagged with the project's version. It is a constant, not read from the installed
package's metadata: the CRD's default (``resources.image``) must not depend on which copy of rljob is
installed where ``make crds`` runs. tests/unit/test_images.py checks it equals pyproject.toml's version
and the chart's appVersion.

    python -m rljob_api.images runtime     # -> rljob/runtime:0.1.0, e.g. for docker build -t
"""

from __future__ import annotations

import sys
from typing import Final

VERSION: Final = "0.1.0"
OPERATOR_REPOSITORY: Final = "rljob/operator"
RUNTIME_REPOSITORY: Final = "rljob/runtime"


def image_ref(repository: str, tag: str = VERSION) -> str:
    """``repository:tag``, the tag defaulting to the project's version."""
    return f"{repository}:{tag}"


OPERATOR_IMAGE: Final = image_ref(OPERATOR_REPOSITORY)
# The default of RLTrainingJob's spec.resources.image (spec_resources.py).
RUNTIME_IMAGE: Final = image_ref(RUNTIME_REPOSITORY)

IMAGES: Final = {"operator": OPERATOR_IMAGE, "runtime": RUNTIME_IMAGE}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in IMAGES:
        print(f"usage: python -m rljob_api.images {{{','.join(IMAGES)}}}", file=sys.stderr)
        return 2
    print(IMAGES[args[0]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
