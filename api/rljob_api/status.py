"""RLTrainingJobStatus: what the operator observed and what the runtime reported.

The operator writes everything but `progress` (field manager rljob-operator); the runtime writes
`progress` (field manager rljob-runtime) through the status subresource.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, get_args

from pydantic import Field

from .base import ApiModel, LabelName, Name

Phase = Literal["Pending", "Queued", "Converting", "Starting", "Running", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[str, ...] = get_args(Phase)
TERMINAL_PHASES: tuple[str, ...] = ("Succeeded", "Failed")  # a job in one never runs again

ConditionType = Literal["Ready", "Reconciling", "Stalled", "Queued", "Succeeded", "Failed", "Suspended"]
CONDITION_TYPES: tuple[str, ...] = get_args(ConditionType)

# Exit status of `rljob-runtime train` for a failure a restart cannot fix (sysexits' EX_CONFIG): the
# job's config, data or model was refused, or the run cannot go on as specified. Ray puts it in the
# Ray job's message, KubeRay copies that into the RayJob's, and the operator then fails the job
# instead of restarting it. Every other non-zero status (1, a signal) is retried up to backoffLimit.
EXIT_NOT_RETRIABLE = 78
# Exit status after a SIGTERM (sysexits' EX_TEMPFAIL): the runtime stopped for a preemption, a suspend or
# a pod going away, with a checkpoint of its last step when the grace period allowed. The operator
# restarts such a job without counting it against backoffLimit.
EXIT_PREEMPTED = 75
RESTART_HISTORY_MAX = 10  # entries of status.restartHistory kept, the most recent last
RESTART_MESSAGE_MAX = 512
CONVERSIONS_MAX = 40  # status.conversions: the megatron conversion and up to 32 on-demand exports + the final


class Condition(ApiModel):
    """A condition in metav1.Condition shape (what kstatus, Argo CD and kubectl wait understand)."""

    type: Annotated[str, Field(min_length=1, max_length=316)] = Field(
        description="Ready, Reconciling, Stalled, Queued, Succeeded, Failed or Suspended."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this condition was computed from."
    )
    last_transition_time: datetime = Field(description="When status last changed.")
    reason: Annotated[
        str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ] = Field(description="CamelCase reason for the last transition, e.g. InsufficientQuota.")
    message: Annotated[str, Field(max_length=32768)] = Field(
        description="What happened and, when something is wrong, what to do about it."
    )


class Progress(ApiModel):
    """Training progress, reported by the runtime after every rollout step (and while it downloads the model)."""

    step: int = Field(default=0, ge=0, description="Rollout steps completed.")
    num_rollout: int = Field(
        default=0, ge=0, description="Rollout steps in the job (spec.training.numRollout)."
    )
    step_text: Annotated[str, Field(max_length=64)] = Field(
        default="", description="step/numRollout, e.g. 120/3000 (the STEP column)."
    )
    reward_mean: float | None = Field(default=None, description="Mean reward of the last rollout step.")
    reward_std: float | None = Field(default=None, description="Reward standard deviation of the last step.")
    response_length_mean: float | None = Field(default=None, description="Mean response length in tokens.")
    step_seconds: float | None = Field(default=None, ge=0, description="Wall time of the last step.")
    eta_seconds: int | None = Field(default=None, ge=0, description="Estimated time to the last step.")
    eval: Annotated[dict[Annotated[str, Field(max_length=63)], float], Field(max_length=16)] = Field(
        default_factory=dict, description="Mean reward of the latest evaluation, per evaluation dataset."
    )
    last_checkpoint: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Path of the latest saved checkpoint."
    )
    last_checkpoint_step: int | None = Field(default=None, ge=0, description="Step of the latest checkpoint.")
    message: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None,
        description="What the runtime is doing before its first step, e.g. 'downloading Qwen/Qwen3-4B@main: "
        "1.2/8.0 GB (15%)'; gone once the first step is reported.",
    )
    trainer_restarts: int | None = Field(
        default=None,
        ge=0,
        description="Times the trainer group was restarted inside the current Ray job "
        "(spec.faultTolerance.maxTrainerRestarts).",
    )
    last_trainer_restart: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None,
        description="What the last in-run trainer restart was: the rank lost, the cause, the step resumed.",
    )
    updated_at: datetime | None = Field(default=None, description="When the runtime last reported.")


class Children(ApiModel):
    """Names of the objects the operator created for this job (all in its namespace)."""

    ray_job: Name | None = Field(default=None, description="The KubeRay RayJob running the runtime.")
    ray_cluster: Name | None = Field(default=None, description="The RayCluster KubeRay created for it.")
    service_account: Name | None = Field(
        default=None, description="The ServiceAccount the runtime uses to report progress."
    )
    conversion_jobs: Annotated[list[Name], Field(max_length=CONVERSIONS_MAX)] | None = Field(
        default=None, description="The RayJobs of the job's checkpoint conversions (status.conversions)."
    )


class Conversion(ApiModel):
    """A checkpoint conversion the operator runs as a RayJob of its own (one pod like the head)."""

    ray_job: Name = Field(description="The RayJob that runs it (kept after it finishes, for its logs).")
    kind: Literal["MegatronCheckpoint", "Export"] = Field(
        description="MegatronCheckpoint: model.path to a Megatron distributed checkpoint in the model cache, "
        "before training (megatron backend with resources.modelCache). Export: a saved iteration to a "
        "Hugging Face directory (checkpoint.export)."
    )
    step: int | None = Field(default=None, ge=0, description="Export: the iteration exported.")
    path: Annotated[str, Field(max_length=4096)] = Field(description="What it writes.")
    state: Literal["Running", "Succeeded", "Failed"] = Field(description="Running, Succeeded or Failed.")
    message: Annotated[str, Field(max_length=RESTART_MESSAGE_MAX)] = Field(
        default="", description="The conversion's last line when it finished (what failed, by name)."
    )


class Restart(ApiModel):
    """A whole-job restart: a new RayJob and Ray cluster after a retriable failure of the last one."""

    attempt: int = Field(ge=1, description="1 for the first restart, 2 for the second, ...")
    time: datetime = Field(description="When the operator saw the failure and decided to restart.")
    reason: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        description="Why the attempt ended: DriverKilled (the runtime was killed by a signal), "
        "RuntimeFailed (it exited non-zero), Preempted (it stopped for a SIGTERM, its last step "
        "checkpointed when the grace period allowed), or KubeRay's reason (e.g. AppFailed, SubmissionFailed)."
    )
    message: Annotated[str, Field(max_length=RESTART_MESSAGE_MAX)] = Field(
        default="", description="The failure in one line (the runtime's last line, or KubeRay's message)."
    )
    exit_code: int | None = Field(
        default=None,
        description="The runtime's exit status as Ray reported it (negative: killed by that signal).",
    )
    ray_job_uid: Annotated[str, Field(max_length=128)] = Field(
        description="metadata.uid of the failed RayJob: each failed attempt is counted once."
    )


class RLTrainingJobStatus(ApiModel):
    """Observed state of an RLTrainingJob."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the operator last acted on."
    )
    phase: Phase | None = Field(
        default=None,
        description="Pending, Queued, Converting, Starting, Running, Succeeded, Failed or Suspended.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Reconciling, Stalled, Queued, Succeeded, Failed, Suspended.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    progress: Progress | None = Field(default=None, description="Training progress reported by the runtime.")
    children: Children | None = Field(default=None, description="Objects created for this job.")
    gpus: int | None = Field(default=None, ge=0, description="GPUs the job requests (trainer + rollout).")
    queue: LabelName | None = Field(default=None, description="Kueue LocalQueue the job was submitted to.")
    restarts: int | None = Field(
        default=None,
        ge=0,
        description="Times the whole job was restarted on a new Ray cluster: after a retriable failure (at "
        "most spec.faultTolerance.backoffLimit of those) or a preemption (preemptions).",
    )
    preemptions: int | None = Field(
        default=None,
        ge=0,
        description="Of the restarts, those after the runtime stopped for a SIGTERM (Preempted: a node "
        "drained, a pod deleted): not counted against spec.faultTolerance.backoffLimit.",
    )
    restart_history: Annotated[list[Restart], Field(max_length=RESTART_HISTORY_MAX)] | None = Field(
        default=None,
        description=f"The last {RESTART_HISTORY_MAX} restarts, the most recent last, with the reason of each.",
    )
    start_time: datetime | None = Field(
        default=None, description="When the job's Ray cluster was first created."
    )
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")
    conversions: Annotated[list[Conversion], Field(max_length=CONVERSIONS_MAX)] | None = Field(
        default=None,
        description="Checkpoint conversions: the Megatron checkpoint made before training, the exports.",
    )
