"""Operations: checkpoints, export, and fault tolerance."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, Name, Path, section
from .rules import immutable


class VolumeSpec(ApiModel):
    """A PersistentVolumeClaim mounted into every pod."""

    claim_name: Name = Field(
        description="PersistentVolumeClaim in the job's namespace (ReadWriteMany for multi-node)."
    )
    sub_path: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="Sub-directory of the volume to mount."
    )


class ExportSpec(ApiModel):
    """Conversion of the final checkpoint to a Hugging Face directory. Not supported yet: only the
    defaults are accepted (every checkpoint already holds a Hugging Face directory, iter_<step>/model)."""

    hugging_face: bool = Field(
        default=False,
        description="Not supported yet (true is refused): when the job succeeds, run a conversion Job that "
        "writes the final weights as a Hugging Face directory (safetensors + config + tokenizer).",
    )
    path: Path | None = Field(
        default=None,
        description="Not supported yet (refused when set): where the conversion writes; defaults to "
        "<checkpoint.path>/hf.",
    )


class CheckpointSpec(ApiModel):
    """Where checkpoints go and how often."""

    rules = (
        immutable("path", "path", hint="resuming reads checkpoints from it; create a new job instead"),
        immutable("volume", "volume", optional=True, hint="resuming reads checkpoints from it"),
    )

    path: Path = Field(
        default="/checkpoints",
        description="Directory for checkpoints inside the pods (iter_<step>/ below it). Resuming needs it to "
        "outlive pods: mount volume there.",
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
        ExportSpec, "Export to Hugging Face format on completion (not supported yet)."
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
