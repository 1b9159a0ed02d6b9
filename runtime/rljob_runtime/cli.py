"""rljob-runtime: the command the operator's RayJob runs, and that users run locally.

rljob-runtime validate --config job.yaml
"""

from __future__ import annotations

import argparse
import sys

from rljob_api.describe import describe

from .config import ConfigError, load_config


def _validate(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        # Contract with the operator: the last line of output is a one-line reason.
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        print(f"rljob-runtime: invalid config: {exc.problems[0]}{more}", file=sys.stderr)
        return 2
    print(f"{config.name or args.config}: valid")
    for topic, line in describe(config.spec):
        print(f"  {topic:<12}{line}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljob-runtime", description="rljob's RL training runtime.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate",
        help="check a job config (an RLTrainingJob manifest or its spec) with the CRD's rules",
        description="Check a job config with the same rules and messages as the API server.",
    )
    validate.add_argument("--config", "-c", required=True, help="YAML file: an RLTrainingJob or its spec")
    validate.set_defaults(run=_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
