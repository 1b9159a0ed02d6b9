"""Operations: checkpoints, export, and fault tolerance."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from .base import ApiModel, Name, section
from .paths import path_rules
from .rules import Rule, immutable

# A directory inside the pods; its form is a rule (paths.py): absolute, no '..'.
AbsolutePath = Annotated[str, Field(min_length=1, max_length=1024)]


class VolumeSpec(ApiModel):
    """A PersistentVolumeClaim mounted into every pod."""

    rules = path_rules(
        "subPath",
        "sub_path",
        form="relative",
        label="checkpoint.volume.subPath",
        example="runs/qwen",
        optional=True,
    )

    claim_name: Name = Field(
        description="PersistentVolumeClaim in the job's namespace (ReadWriteMany for multi-node)."
    )
    sub_path: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        default=None, description="Sub-directory of the volume to mount: a relative path, without '..'."
    )


class ExportSpec(ApiModel):
    """Checkpoints exported as Hugging Face directories by conversion jobs the operator runs (a RayJob
    each, on a pod like the head, reading the checkpoint volume): the final one when the job succeeds,
    and any saved iteration on demand."""

    rules = path_rules(
        "path",
        "path",
        form="absolute",
        label="checkpoint.export.path",
        example="/checkpoints/hf",
        optional=True,
    )

    hugging_face: bool = Field(
        default=False,
        description="When training finishes, export the final checkpoint to <path>/iter_<numRollout, 7 "
        "digits>/ (safetensors + config + tokenizer: what transformers and SGLang load), each tensor checked "
        "against the checkpoint; the job is Converting meanwhile and Succeeded once it is written. Needs "
        "checkpoint.volume.",
    )
    path: AbsolutePath | None = Field(
        default=None,
        description="Directory the exports go to, one iter_<step>/ each; defaults to <checkpoint.path>/hf. "
        "An absolute path without '..'. "
        "It must lie on a volume the conversion pod writes: below checkpoint.path or below the mountPath "
        "of a writable persistentVolumeClaim in resources.volumes.",
    )
    steps: Annotated[list[Annotated[int, Field(ge=1, le=10000000)]], Field(max_length=32)] = Field(
        default_factory=list,
        description="Saved iterations to export as well, on demand: each runs as soon as the run has saved "
        "it (status.progress.lastCheckpointStep) or at once for a finished job; may be added to a running or "
        "finished job. Steps pruned by maxToKeep before their export runs fail it, saying so.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    def wanted(self) -> bool:
        return self.hugging_face or bool(self.steps)


class CheckpointSpec(ApiModel):
    """Where checkpoints go and how often."""

    rules = (
        *path_rules("path", "path", form="absolute", label="checkpoint.path", example="/checkpoints"),
        immutable("path", "path", hint="resuming reads checkpoints from it; create a new job instead"),
        immutable("volume", "volume", optional=True, hint="resuming reads checkpoints from it"),
    )

    path: AbsolutePath = Field(
        default="/checkpoints",
        description="Directory for checkpoints inside the pods (iter_<step>/ below it), where the checkpoint "
        "volume is mounted: an absolute path without '..'. Resuming needs it to outlive pods: mount volume "
        "there.",
    )
    volume: VolumeSpec | None = Field(
        default=None,
        description="PersistentVolumeClaim mounted at path. Without one, checkpoints live in the pods' "
        "ephemeral storage and are lost when they go.",
    )
    save_interval: int = Field(
        default=0, ge=0, le=10000000, description="Save every N rollout steps; 0 saves only at the end."
    )
    max_to_keep: int = Field(
        default=3, ge=0, le=1000, description="Checkpoints kept (oldest deleted first); 0 keeps all."
    )
    resume: Literal["auto", "never", "required"] = Field(
        default="auto",
        description="auto: continue from the latest checkpoint under path if there is one; never: always "
        "start fresh; required: fail if there is none.",
    )
    export: ExportSpec = section(
        ExportSpec, "Export checkpoints to Hugging Face directories (conversion jobs run by the operator)."
    )


class HealthCheckSpec(ApiModel):
    """Periodic GET /health_generate against every rollout engine."""

    enabled: bool = Field(default=True, description="Check engines and replace dead ones.")
    first_wait_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="Grace period after an engine starts (model load, CUDA graphs).",
    )
    interval_seconds: int = Field(default=30, ge=1, le=86400, description="Time between checks.")
    timeout_seconds: int = Field(default=30, ge=1, le=86400, description="A check slower than this fails.")


class FaultToleranceSpec(ApiModel):
    """What happens when parts of the job fail."""

    engine_health_check: HealthCheckSpec = section(HealthCheckSpec, "Rollout engine health checks.")
    max_engine_restarts: int = Field(
        default=10,
        ge=0,
        le=10000,
        description="Dead engines are replaced at once (their requests retried on live engines); the job "
        "fails after this many replacements.",
    )
    max_trainer_restarts: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="When a trainer process is lost (killed, its node gone), restart only the trainer group, "
        "on the same placement, from the run's latest checkpoint (the engines keep running and get its "
        "weights), at most this many times in one Ray job; the steps after that checkpoint are done again. "
        "Beyond it (or at 0) the Ray job fails and backoffLimit decides.",
    )
    backoff_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Times the operator restarts the job on a new Ray job (a fresh Ray cluster) after it "
        "fails for a retriable reason (the driver killed or crashed, a pod or node lost); it resumes from "
        "the latest checkpoint (checkpoint.resume auto). A job the runtime refuses (bad config or data) "
        "is not retried. Each restart is in status.restarts and status.restartHistory.",
    )
    termination_grace_period_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="The pods' terminationGracePeriodSeconds: the time a preempted, suspended or deleted job "
        "has after SIGTERM. The runtime finishes the step in flight, saves a checkpoint of it and exits as "
        "preempted (the operator restarts it without counting a failure); the job resumes from that "
        "checkpoint. When the step and the save do not fit in it, the runtime stops before SIGKILL and the "
        "job resumes from its last periodic checkpoint (checkpoint.saveInterval).",
    )
    startup_timeout_seconds: int = Field(
        default=600,
        ge=30,
        le=604800,
        description="How long a pod of a starting job may stay stuck (image pull failing, unschedulable, "
        "its creation refused by a ResourceQuota, its head crash-looping) before the job is Stalled (or "
        "Failed, see onStartupTimeout). The reason shows in the job's status at once; this only decides "
        "when it counts as stuck for good.",
    )
    on_startup_timeout: Literal["Stall", "Fail"] = Field(
        default="Stall",
        description="Stall: the job stays Starting with Stalled=True and starts by itself if the cause "
        "clears. Fail: the job becomes Failed and its RayJob is suspended, so KubeRay deletes the Ray "
        "cluster and its pods stop holding quota (the RayJob stays for inspection).",
    )


def export_root(checkpoint: CheckpointSpec) -> str:
    """Where exports go: checkpoint.export.path, else <checkpoint.path>/hf."""
    return checkpoint.export.path or f"{checkpoint.path.rstrip('/')}/hf"


_EXPORTS = "(self.checkpoint.export.huggingFace || size(self.checkpoint.export.steps) > 0)"
_EXPORT_PATH = "self.checkpoint.export.path"


def _export_path_writable(spec: Any) -> bool:
    path = spec.checkpoint.export.path
    if path is None or not path.startswith("/"):  # a relative path: ExportSpec's own rule says so
        return True
    below = [spec.checkpoint.path] + [
        v.mount_path
        for v in spec.resources.volumes
        if v.persistent_volume_claim is not None and not v.read_only
    ]
    # As the CEL below: absolute paths without a trailing '/' (paths.py), compared by text.
    return any(path.startswith(root + "/") for root in below)


# On the spec: exports are written by a pod of their own, which sees the checkpoints and the export
# directory only through volumes.
EXPORT_RULES = (
    Rule(
        cel=f"!{_EXPORTS} || has(self.checkpoint.volume)",
        message="checkpoint.export needs checkpoint.volume: the conversion runs in a pod of its own and "
        "reads the checkpoints from that volume",
        field=".checkpoint.export",
        check=lambda s: not s.checkpoint.export.wanted() or s.checkpoint.volume is not None,
    ),
    Rule(
        cel=f"!has({_EXPORT_PATH}) || !{_EXPORT_PATH}.startsWith('/') || "
        f"{_EXPORT_PATH}.startsWith(self.checkpoint.path + '/') || "
        "(has(self.resources.volumes) && self.resources.volumes.exists(v, has(v.persistentVolumeClaim) && "
        f"!(has(v.readOnly) && v.readOnly) && {_EXPORT_PATH}.startsWith(v.mountPath + '/')))",
        message="checkpoint.export.path must lie below checkpoint.path or below the mountPath of a writable "
        "persistentVolumeClaim in resources.volumes, where the export outlives the conversion pod",
        field=".checkpoint.export.path",
        check=_export_path_writable,
    ),
    Rule(
        cel="self.checkpoint.export.steps.all(s, s <= self.training.numRollout)",
        message="checkpoint.export.steps: every step must be at most training.numRollout (the run saves "
        "no later iteration)",
        field=".checkpoint.export.steps",
        check=lambda s: all(step <= s.training.num_rollout for step in s.checkpoint.export.steps),
    ),
)
