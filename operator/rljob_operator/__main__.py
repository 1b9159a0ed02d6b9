"""rljob-operator entry point (python -m rljob_operator)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # The reconciler lands with the operator issue (#4); until then say so instead of pretending.
    print(
        "rljob-operator: the operator is not implemented yet (it lands with issue #4). "
        "Install the CRD with `kubectl apply --server-side -f crds/`.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
