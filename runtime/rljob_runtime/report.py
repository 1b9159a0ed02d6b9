"""Progress of a run: one line per step on stdout, TensorBoard scalars, and under the operator the
RLTrainingJob's status.progress (server-side apply, field manager rljob-runtime).

`progress_document` and `progress_line` are pure; the reporter does the I/O. A failed status
patch is logged and retried at the next step: reporting never stops training.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from rljob_api.contract import RUNTIME_FIELD_MANAGER, RUNTIME_MESSAGE_FIELD_MANAGER
from rljob_api.events import event_body
from rljob_api.resource import API_VERSION, KIND

from .wandb_log import WandbLogger

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi

log = logging.getLogger("rljob.report")


@dataclass(frozen=True)
class JobIdentity:
    name: str
    namespace: str
    uid: str | None = None  # events carry it: `kubectl describe` matches them by uid

    @classmethod
    def from_env(cls) -> JobIdentity | None:
        """The job this pod runs for (RLJOB_JOB_NAME, RLJOB_NAMESPACE: set by the operator), else None."""
        name, namespace = os.environ.get("RLJOB_JOB_NAME"), os.environ.get("RLJOB_NAMESPACE")
        return cls(name, namespace) if name and namespace else None


def progress_document(
    step: int,
    total: int,
    metrics: Mapping[str, float],
    *,
    now: datetime,
    checkpoint: tuple[int, str] | None = None,
    eval_rewards: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """status.progress as the CRD declares it (camelCase; floats rounded for `kubectl get`)."""
    doc: dict[str, Any] = {
        "step": step,
        "numRollout": total,
        "stepText": f"{step}/{total}",
        "updatedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    for key, metric in (
        ("rewardMean", "reward/mean"),
        ("rewardStd", "reward/std"),
        ("responseLengthMean", "response_length/mean"),
        ("stepSeconds", "time/step"),
    ):
        value = metrics.get(metric)
        if value is not None and math.isfinite(value):
            doc[key] = round(float(value), 4)
    step_time = metrics.get("time/step")
    if step_time is not None and math.isfinite(step_time):
        doc["etaSeconds"] = int(step_time * max(0, total - step))
    if eval_rewards:
        doc["eval"] = {name: round(float(v), 4) for name, v in eval_rewards.items()}
    if checkpoint is not None:
        doc["lastCheckpointStep"], doc["lastCheckpoint"] = checkpoint
    return doc


def message_document(message: str, *, now: datetime) -> dict[str, Any]:
    """status.progress before the first step: what the runtime is doing (a step's report replaces it)."""
    return {"message": message[:1024], "updatedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")}


def step_scalars(
    metrics: Mapping[str, float], eval_rewards: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The scalars of one step for TensorBoard and W&B: the metrics, and eval/<dataset>/reward."""
    return {**metrics, **{f"eval/{name}/reward": value for name, value in (eval_rewards or {}).items()}}


def progress_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    """`[  3/20  15%] reward 0.412±0.200 len 31 trunc 0.06 kl 0.0012 clip 0.020 | gen 12.1s train 8.3s sync 0.4s | 210 tok/s | eta 4m12s`"""
    width = len(str(total))
    parts = [f"[{step:>{width}}/{total} {100 * step // max(total, 1):>3}%]"]

    def metric(label: str, key: str, fmt: str) -> None:
        if key in metrics:
            parts.append(f"{label} {format(metrics[key], fmt)}")

    if "reward/mean" in metrics:
        parts.append(f"reward {metrics['reward/mean']:.3f}±{metrics.get('reward/std', 0.0):.3f}")
    metric("len", "response_length/mean", ".0f")
    metric("trunc", "response/truncated_frac", ".2f")
    metric("kl", "train/ppo_kl", ".4f")
    metric("clip", "train/pg_clipfrac", ".3f")
    times = [
        f"{k[5:]} {metrics[k]:.1f}s"
        for k in ("time/generate", "time/train", "time/sync", "time/save")
        if k in metrics
    ]
    if times:
        parts.append("| " + " ".join(times))
    if "rollout/tokens_per_s" in metrics:
        parts.append(f"| {metrics['rollout/tokens_per_s']:.0f} tok/s")
    if "time/step" in metrics:
        parts.append(f"| eta {_duration(metrics['time/step'] * max(0, total - step))}")
    return " ".join(parts)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class ProgressReporter:
    """stdout + TensorBoard + (when `job` is set) the RLTrainingJob status."""

    def __init__(
        self,
        total: int,
        *,
        job: JobIdentity | None,
        tensorboard_dir: str | None,
        stream: TextIO = sys.stdout,
        wandb: WandbLogger | None = None,
    ) -> None:
        self.total = total
        self.job = job
        self.stream = stream
        self.wandb = wandb  # the same scalars as TensorBoard (wandb_log.py)
        self.writer = None
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(tensorboard_dir)
        self._api: CustomObjectsApi | None = None  # made on first use
        self._message_cleared = False
        self._progress: dict[str, Any] = {}  # the last step's status.progress, repeated by restarts
        self._restarts: dict[str, Any] = {}  # trainerRestarts, lastTrainerRestart once there was one

    def step(
        self,
        step: int,
        metrics: Mapping[str, float],
        *,
        checkpoint: tuple[int, str] | None = None,
        eval_rewards: Mapping[str, float] | None = None,
    ) -> None:
        print(progress_line(step, self.total, metrics), file=self.stream, flush=True)
        scalars = step_scalars(metrics, eval_rewards)
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(step, scalars)
        if self.job is not None:
            doc = progress_document(
                step,
                self.total,
                metrics,
                now=datetime.now(UTC),
                checkpoint=checkpoint,
                eval_rewards=eval_rewards,
            )
            self._progress = doc
            # One field manager owns these fields: a field left out of an apply is removed.
            self._patch({**doc, **self._restarts})
            if not self._message_cleared:  # the first step: the message's work is over
                self._patch({}, manager=RUNTIME_MESSAGE_FIELD_MANAGER)
                self._message_cleared = True

    def baseline(self, eval_rewards: Mapping[str, float]) -> None:
        """The evaluation before the first step (data.eval.beforeTraining): a line, and the scalars at
        step 0 beside the later evaluations'."""
        shown = ", ".join(f"{name} {value:.4f}" for name, value in eval_rewards.items())
        print(f"eval before training: {shown}", file=self.stream, flush=True)
        scalars = step_scalars({}, eval_rewards)
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, 0)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(0, scalars)

    def resumed(self, step: int, checkpoint: str) -> None:
        """A run that starts from a checkpoint: a line, and a Normal event Resumed on the job, so a
        restart nobody else saw (KubeRay submitting the job again to a replaced head pod) shows in
        `kubectl describe`."""
        message = f"resumed from step {step} ({checkpoint})"
        print(message, file=self.stream, flush=True)
        if self.job is not None:
            self._event("Normal", "Resumed", message)

    def trainer_restarted(self, count: int, message: str) -> None:
        """An in-run trainer restart: a line, status.progress.trainerRestarts and lastTrainerRestart,
        and a Warning event TrainerRestarted on the job."""
        print(message, file=self.stream, flush=True)
        if self.job is None:
            return
        self._restarts = {"trainerRestarts": count, "lastTrainerRestart": message[:1024]}
        self._patch({**self._progress, **self._restarts})
        self._event("Warning", "TrainerRestarted", message)

    def _event(self, type_: str, reason: str, message: str) -> None:
        assert self.job is not None
        try:
            from kubernetes import client

            if self._api is None:
                self._api = _status_api()
            body = event_body(
                {"metadata": {"name": self.job.name, "namespace": self.job.namespace, "uid": self.job.uid}},
                type_,
                reason,
                message,
                component=RUNTIME_FIELD_MANAGER,
                instance=socket.gethostname(),
                action="Train",
                now=datetime.now(UTC),
            )
            client.CoreV1Api(self._api.api_client).create_namespaced_event(self.job.namespace, body)
        except Exception as exc:  # never stop training for an event
            log.warning(
                "could not post event %s on RLTrainingJob %s/%s: %s",
                reason,
                self.job.namespace,
                self.job.name,
                exc,
            )

    def message(self, text: str) -> None:
        """A line about work before the first step (a model download): stdout and status.progress.message."""
        print(text, file=self.stream, flush=True)
        if self.job is not None:
            self._patch(message_document(text, now=datetime.now(UTC)), manager=RUNTIME_MESSAGE_FIELD_MANAGER)

    def _patch(self, progress: dict[str, Any], *, manager: str = RUNTIME_FIELD_MANAGER) -> None:
        assert self.job is not None
        try:
            if self._api is None:
                self._api = _status_api()
            body = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": self.job.name, "namespace": self.job.namespace},
                "status": {"progress": progress},
            }
            self._api.patch_namespaced_custom_object_status(
                "rljob.dev",
                "v1alpha1",
                self.job.namespace,
                "rltrainingjobs",
                self.job.name,
                body,
                field_manager=manager,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except Exception as exc:  # never stop training for a status update
            log.warning(
                "could not report progress to RLTrainingJob %s/%s: %s", self.job.namespace, self.job.name, exc
            )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _status_api() -> CustomObjectsApi:
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # the ServiceAccount the operator created for this job
    except config.ConfigException:
        # $KUBECONFIG as it is now: the client reads it once, when it is first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.CustomObjectsApi()
