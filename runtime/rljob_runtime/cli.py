"""rljob-runtime: the command the operator's RayJob runs, and that users run locally.

rljob-runtime validate --config job.yaml
rljob-runtime train --config job.yaml

`train` exits 0 when the run succeeded, EXIT_NOT_RETRIABLE (78) when the job cannot run as
configured (an invalid config, `prepare` refused the spec, the data or the model, or a configuration
error met later in the run: config_errors), EXIT_PREEMPTED (75) after a SIGTERM (preemption.py: the
step in flight finished and checkpointed, or the grace period ran out), 1 for any other failure (the
run itself failed) and 130 when interrupted (Ctrl-C, a second SIGTERM); a killed runtime has no say.
The operator restarts the whole job (up to faultTolerance.backoffLimit) for every failure but 78, and
after 75 without counting it.
"""

from __future__ import annotations

import argparse
import os
import sys

from rljob_api.describe import describe
from rljob_api.status import EXIT_NOT_RETRIABLE, EXIT_PREEMPTED

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
    if args.prepare:
        # What `train` checks before it starts Ray: tokenizer, data, reward, hooks.
        from .prepare import prepare
        from .run_error import RunError

        try:
            prepared = prepare(config.spec)
        except (RunError, ValueError, RuntimeError, OSError) as exc:
            print(f"rljob-runtime: invalid job: {' '.join(str(exc).split())}"[:1000], file=sys.stderr)
            return 2
        print(
            f"{config.name or args.config}: valid; {len(prepared.source)} prompts, {len(prepared.eval_sets)} eval dataset(s)"
        )
    else:
        print(f"{config.name or args.config}: valid")
    for topic, line in describe(config.spec):
        print(f"  {topic:<12}{line}")
    return 0


def _train(args: argparse.Namespace) -> int:
    import logging
    import os

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except Exception as exc:  # a config that cannot be read or validated is final, whatever the error
        if not isinstance(exc, ConfigError):
            exc = ConfigError(
                [f"{type(exc).__name__}: {' '.join(str(exc).split())}"], source=str(args.config)
            )
        print(exc, file=sys.stderr)
        print(f"rljob-runtime: invalid config: {exc.problems[0]}", file=sys.stderr)
        return EXIT_NOT_RETRIABLE
    from .config_errors import is_config_error
    from .driver import RunOptions, run
    from .prepare import prepare
    from .report import JobIdentity
    from .run_error import RunError
    from .wandb_log import RunIdentity

    report = args.report_status == "on" or (
        args.report_status == "auto" and str(args.config).startswith("env:")
    )
    job = (
        JobIdentity(config.name, config.namespace or "default", config.uid)
        if report and config.name
        else None
    )
    print(f"{config.name or args.config}: starting", flush=True)
    for topic, line in describe(config.spec):
        print(f"  {topic:<12}{line}", flush=True)

    from . import preemption

    preemption.configure(config.spec.fault_tolerance.termination_grace_period_seconds)
    preemption.install()
    try:
        try:
            prepared = prepare(config.spec)
        except Exception as exc:
            if refused_by_prepare(exc) or is_config_error(exc):
                print(f"rljob-runtime: failed: {' '.join(str(exc).split())}"[:1000], file=sys.stderr)
                return EXIT_NOT_RETRIABLE
            raise
        if prepared.dropped_prompts:
            print(
                f"  dropped {prepared.dropped_prompts} prompt(s) longer than data.maxPromptLength", flush=True
            )
        result = run(
            prepared,
            RunOptions(
                job=job,
                identity=RunIdentity(config.name, config.namespace, config.uid),
                tensorboard_dir=args.tensorboard or os.path.join(config.spec.checkpoint.path, "tensorboard"),
                resume=args.resume,
                stop_after=args.stop_after,
                ray_address=args.ray_address or os.environ.get("RAY_ADDRESS"),
            ),
        )
    except KeyboardInterrupt:
        if preemption.current().requested:
            print(
                "rljob-runtime: preempted before the step in flight and its checkpoint were done (grace period "
                f"{preemption.current().grace_s:.0f} s); the job resumes from its last checkpoint",
                file=sys.stderr,
            )
            return EXIT_PREEMPTED
        print("rljob-runtime: interrupted; stopped engines, router and trainer", file=sys.stderr)
        return 130
    except Exception as exc:
        # Contract with the operator: the last line of output is a one-line reason. Once running, a
        # failure is retriable (exit 1): a new Ray cluster may get past it, up to backoffLimit; a
        # configuration error is not, wherever it comes from (config_errors).
        if is_config_error(exc):
            print(f"rljob-runtime: failed: {' '.join(str(exc).split())}"[:1000], file=sys.stderr)
            return EXIT_NOT_RETRIABLE
        if not isinstance(exc, RunError | ValueError | RuntimeError | NotImplementedError | OSError):
            raise
        print(f"rljob-runtime: failed: {' '.join(str(exc).split())}"[:1000], file=sys.stderr)
        return 1
    if result.preempted:
        resumes = (
            f"the job resumes from its checkpoint {result.last_checkpoint}"
            if result.last_checkpoint
            else "the job starts again from the beginning"
        )
        print(f"rljob-runtime: preempted after step {result.steps_done}; {resumes}", file=sys.stderr)
        return EXIT_PREEMPTED
    print(f"done: {result.steps_done} steps; last checkpoint {result.last_checkpoint}", flush=True)
    return 0


def refused_by_prepare(exc: BaseException) -> bool:
    """Whether `prepare` refused the job for a reason a restart cannot change: the support matrix or
    a spec rule (RunError), the data or a template (ValueError), a local model path that does not
    exist. Not a hub download (HubError): the hub may be unreachable or failing for a while."""
    from .models.errors import ModelNotFoundError
    from .models.hub_rules import HubError
    from .run_error import RunError

    if isinstance(exc, HubError):
        return False
    return isinstance(exc, RunError | ValueError | NotImplementedError | ModelNotFoundError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljob-runtime", description="rljob's RL training runtime.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate",
        help="check a job config (an RLTrainingJob manifest or its spec) with the CRD's rules",
        description="Check a job config with the same rules and messages as the API server.",
    )
    validate.add_argument("--config", "-c", required=True, help="YAML file: an RLTrainingJob or its spec")
    validate.add_argument(
        "--prepare",
        action="store_true",
        help="also load the tokenizer, the data, the reward and the hooks, as `train` does before it starts Ray",
    )
    validate.set_defaults(run=_validate)
    train = commands.add_parser(
        "train",
        help="run the RL training loop (the operator's RayJob runs this)",
        description="Run the training loop on Ray: generate, reward, train, sync weights, checkpoint, report.",
    )
    train.add_argument(
        "--config", "-c", required=True, help="YAML file, or env:NAME to read it from a variable"
    )
    train.add_argument(
        "--resume", choices=["auto", "never", "required"], default=None, help="override checkpoint.resume"
    )
    train.add_argument(
        "--tensorboard",
        default=None,
        help="TensorBoard log directory (default: <checkpoint.path>/tensorboard)",
    )
    train.add_argument(
        "--stop-after", type=int, default=None, help="stop after this many steps (checkpoint first)"
    )
    train.add_argument(
        "--ray-address",
        default=None,
        help="an existing Ray cluster (default: $RAY_ADDRESS, else a local one)",
    )
    train.add_argument(
        "--report-status",
        choices=["auto", "on", "off"],
        default="auto",
        help="patch the RLTrainingJob's status.progress (auto: when the config comes from env:)",
    )
    train.set_defaults(run=_train)
    stop = commands.add_parser(
        "stop",
        help="SIGTERM the `train` processes of this machine or pod and wait for them to exit (the head pod's preStop hook)",
        description="Preempt the local `rljob-runtime train`: it finishes its step, saves a checkpoint and exits.",
    )
    stop.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for them to exit (default: 300)"
    )
    stop.set_defaults(run=_stop)
    convert = commands.add_parser(
        "convert",
        help="convert checkpoints: hf-to-dist, dist-to-hf, verify, megatron-cache, export "
        "(the operator's conversion jobs run this)",
        description="Checkpoint conversions (rljob_runtime.convert_cli); `convert -h` lists them.",
        add_help=False,  # -h goes to the conversion CLI
    )
    convert.add_argument("args", nargs=argparse.REMAINDER)
    convert.set_defaults(run=_convert)
    return parser


def _stop(args: argparse.Namespace) -> int:
    from .stop import stop

    signalled, left = stop(args.timeout)
    if not signalled:
        print("rljob-runtime stop: no `rljob-runtime train` process here")
        return 0
    if left:
        print(f"rljob-runtime stop: still running after {args.timeout:.0f} s: {left}", file=sys.stderr)
        return 1
    print(f"rljob-runtime stop: {len(signalled)} train process(es) stopped: {signalled}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    # Before anything initialises CUDA: conversion is CPU work (gloo), whatever the node has.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from .convert_cli import main as convert_main

    return convert_main(args.args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["convert"]:  # everything after it, -h too, is the conversion CLI's
        return _convert(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
