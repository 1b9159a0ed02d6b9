"""Per-step metrics to Weights & Biases: the same scalars as TensorBoard (``report.step_scalars``).

On when WANDB_API_KEY is set (the operator sets it from resources.secrets.wandbApiKey) or
WANDB_MODE is offline; WANDB_MODE=disabled turns it off. The run is named after the job:
project ``rljob-<namespace>``, run name the job's name, run id the job's uid (so a retried Ray job,
faultTolerance.backoffLimit, continues the same W&B run); WANDB_PROJECT, WANDB_NAME and WANDB_RUN_ID
override them, and WANDB_ENTITY, WANDB_DIR and the rest are W&B's own. W&B never stops training: a
failure to start or to log is logged once and W&B is off for the rest of the run.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rljob.wandb")


@dataclass(frozen=True)
class RunIdentity:
    """Who the run is: the RLTrainingJob's name, namespace and uid (None for a bare local spec)."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None


def wandb_wanted(env: Mapping[str, str]) -> bool:
    mode = env.get("WANDB_MODE", "").lower()
    if mode in ("disabled", "dryrun-disabled"):
        return False
    return bool(env.get("WANDB_API_KEY")) or mode in ("offline", "dryrun")


def init_arguments(identity: RunIdentity, env: Mapping[str, str]) -> dict[str, Any]:
    """wandb.init's project / name / id from the job; a W&B variable that is set wins (by leaving
    the argument out: an explicit argument would override the variable)."""
    args: dict[str, Any] = {}
    if "WANDB_PROJECT" not in env:
        args["project"] = f"rljob-{identity.namespace}" if identity.namespace else "rljob"
    if "WANDB_NAME" not in env and identity.name:
        args["name"] = identity.name
    if "WANDB_RUN_ID" not in env and identity.uid:
        args["id"] = re.sub(r"[^A-Za-z0-9_-]", "-", identity.uid)  # W&B run ids: no '/', ':' ...
        args["resume"] = "allow"  # a retried Ray job continues the run
    return args


class WandbLogger:
    """One W&B run; `log` and `finish` never raise."""

    def __init__(self, run: Any) -> None:
        self.run: Any | None = run

    @classmethod
    def start(
        cls, identity: RunIdentity, config: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> WandbLogger | None:
        """A logger when W&B is wanted and starts, else None (the reason logged)."""
        env = os.environ if env is None else env
        if not wandb_wanted(env):
            return None
        try:
            import wandb

            run = wandb.init(
                config=dict(config),
                # no console capture: the runtime's own stdout/stderr (its last line is the exit reason)
                settings=wandb.Settings(console="off"),
                **init_arguments(identity, env),
            )
        except Exception as exc:  # W&B must not stop training
            log.warning("W&B is off for this run: could not start a run: %s", exc)
            return None
        log.info("W&B run %s (project %s)", run.id, run.project)
        return cls(run)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(dict(scalars), step=step)
        except Exception as exc:
            log.warning("W&B is off for the rest of this run: logging step %d failed: %s", step, exc)
            self._finish_quietly()

    def finish(self) -> None:
        if self.run is not None:
            self._finish_quietly()

    def _finish_quietly(self) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        try:
            run.finish()
        except Exception as exc:
            log.warning("W&B run did not finish cleanly: %s", exc)
