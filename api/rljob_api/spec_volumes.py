"""Volumes mounted in every job pod: where models, data and hooks come from.

Each volume is a core/v1 volume source (a subset: the ones jobs need) plus where it is mounted.
The rules mirror what pod validation would refuse in the RayCluster's pods, so a bad volume is
refused when the job is applied instead of leaving its pods uncreated.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import DNS_LABEL_PATTERN, ApiModel, Name, Quantity
from .paths import path_rules
from .pod_paths import RESERVED_MOUNT_PATHS, RESERVED_VOLUME_NAMES
from .rules import Rule

# Paths are bounded strings here; their forms (absolute or relative, no '..') are rules (paths.py),
# so that the API server and Python refuse them with the same message.
MountPath = Annotated[str, Field(min_length=1, max_length=1024)]
SubPath = Annotated[str, Field(min_length=1, max_length=1024)]

VolumeName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


def overlaps(a: str, b: str) -> bool:
    """True when one path is the other or lies below it ('/data' and '/data/x'; not '/data2')."""
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def overlaps_cel(a: str, b: str) -> str:
    """CEL for `overlaps` on two paths without trailing '/' (the absolute-path rule guarantees it;
    '/' itself overlaps everything)."""
    return (
        f"({a} == {b} || {a} == '/' || {b} == '/' || {a}.startsWith({b} + '/') || {b}.startsWith({a} + '/'))"
    )


class KeyToPath(ApiModel):
    """One key of a ConfigMap or Secret projected as a file."""

    rules = path_rules("path", "path", form="relative", label="path", example="config/reward.py")

    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="Key in the ConfigMap or Secret."
    )
    path: SubPath = Field(description="Relative file path in the volume.")


class ConfigMapVolume(ApiModel):
    """A ConfigMap as files (hooks, chat templates, small configs)."""

    name: Name = Field(description="ConfigMap in the job's namespace.")
    items: list[KeyToPath] = Field(
        default_factory=list, max_length=64, description="Keys to project; empty projects every key."
    )
    optional: bool = Field(default=False, description="Start even if it does not exist.")


class SecretVolume(ApiModel):
    """A Secret as files, readable only by the pods' user (mode 0400)."""

    secret_name: Name = Field(description="Secret in the job's namespace.")
    items: list[KeyToPath] = Field(
        default_factory=list, max_length=64, description="Keys to project; empty projects every key."
    )
    optional: bool = Field(default=False, description="Start even if it does not exist.")


class ClaimVolume(ApiModel):
    """A PersistentVolumeClaim (shared models, datasets; ReadWriteMany when several pods mount it)."""

    claim_name: Name = Field(description="PersistentVolumeClaim in the job's namespace.")


class HostPathVolume(ApiModel):
    """A directory of the node (node-local model caches). Refused by the operator unless its admin
    allows the path (rljob-operator --allow-host-path, chart value jobPods.allowedHostPaths)."""

    rules = path_rules("path", "path", form="absolute", label="hostPath.path", example="/mnt/nvme/models")

    path: MountPath = Field(description="Absolute path on the node.")
    type: Literal["", "Directory", "DirectoryOrCreate"] = Field(
        default="Directory",
        description="Directory: must exist on the node; DirectoryOrCreate: created if missing.",
    )


class EmptyDirVolume(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] = Field(default="", description="'' (node disk) or Memory (tmpfs).")
    size_limit: Quantity | None = Field(default=None, description="Size limit, e.g. '100Gi'.")


_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "hostPath", "emptyDir")
_SOURCE_ATTRS = ("persistent_volume_claim", "config_map", "secret", "host_path", "empty_dir")


class Volume(ApiModel):
    """A volume mounted at the same path in every pod of the job (head, trainer and rollout)."""

    rules = (
        Rule(
            cel=" + ".join(f"(has(self.{s}) ? 1 : 0)" for s in _SOURCES) + " == 1",
            message="set exactly one of persistentVolumeClaim, configMap, secret, hostPath and emptyDir",
            field=".persistentVolumeClaim",
            check=lambda v: sum(getattr(v, a) is not None for a in _SOURCE_ATTRS) == 1,
        ),
        *path_rules("mountPath", "mount_path", form="absolute", label="mountPath", example="/shared/models"),
        *path_rules("subPath", "sub_path", form="relative", label="subPath", example="models", optional=True),
        Rule(
            cel=f"!{[*RESERVED_VOLUME_NAMES]!r}.exists(n, n == self.name)".replace('"', "'"),
            message=f"name is used by the operator's own volumes ({', '.join(RESERVED_VOLUME_NAMES)}); "
            "choose another",
            field=".name",
            check=lambda v: v.name not in RESERVED_VOLUME_NAMES,
        ),
        Rule(
            cel=f"!{[*RESERVED_MOUNT_PATHS]!r}.exists(p, {overlaps_cel('p', 'self.mountPath')})".replace(
                '"', "'"
            ),
            message=f"mountPath overlaps a path the operator mounts itself ({', '.join(RESERVED_MOUNT_PATHS)}); "
            "choose another (resources.modelCache and resources.secrets mount those)",
            field=".mountPath",
            check=lambda v: not any(overlaps(p, v.mount_path) for p in RESERVED_MOUNT_PATHS),
        ),
    )

    name: VolumeName = Field(description="Volume name (a DNS label), unique in the job.")
    mount_path: MountPath = Field(description="Absolute path where the pods see it, e.g. /shared/models.")
    sub_path: SubPath | None = Field(
        default=None, description="Mount this directory of the volume instead of its root."
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    persistent_volume_claim: ClaimVolume | None = Field(default=None, description="A PersistentVolumeClaim.")
    config_map: ConfigMapVolume | None = Field(default=None, description="A ConfigMap's keys as files.")
    secret: SecretVolume | None = Field(default=None, description="A Secret's keys as files (mode 0400).")
    host_path: HostPathVolume | None = Field(
        default=None, description="A node directory; only where the operator's admin allows its path."
    )
    empty_dir: EmptyDirVolume | None = Field(default=None, description="Per-pod scratch space.")

    def source(self) -> tuple[str, ApiModel]:
        """(the camelCase name of the volume source that is set, its value)."""
        return next(
            (s, getattr(self, a))
            for s, a in zip(_SOURCES, _SOURCE_ATTRS, strict=True)
            if getattr(self, a) is not None
        )


Volumes = Annotated[list[Volume], Field(max_length=32)]

VOLUME_LIST_RULES = (
    Rule(
        cel="!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
        message="volumes: names must be unique",
        field=".volumes",
        check=lambda r: len({v.name for v in r.volumes}) == len(r.volumes),
    ),
    Rule(
        cel="!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, "
        + overlaps_cel("w.mountPath", "v.mountPath")
        + "))",
        message="volumes: mount paths may not be equal or nested (a path inside another volume's mountPath)",
        field=".volumes",
        check=lambda r: all(
            sum(overlaps(w.mount_path, v.mount_path) for w in r.volumes) == 1 for v in r.volumes
        ),
    ),
)

# On the spec: the checkpoint volume is mounted at checkpoint.path, so no other mount may overlap it.
CHECKPOINT_MOUNT_RULES = (
    Rule(
        cel="!has(self.resources.volumes) || !self.resources.volumes.exists(v, "
        + overlaps_cel("v.mountPath", "self.checkpoint.path")
        + ")",
        message="resources.volumes: a mountPath overlaps checkpoint.path, where the checkpoint volume is "
        "mounted; put checkpoints on their own path (checkpoint.volume names their claim)",
        field=".resources.volumes",
        check=lambda s: not any(overlaps(v.mount_path, s.checkpoint.path) for v in s.resources.volumes),
    ),
    Rule(
        cel=f"!{[*RESERVED_MOUNT_PATHS]!r}.exists(p, ".replace('"', "'")
        + overlaps_cel("p", "self.checkpoint.path")
        + ")",
        message=f"checkpoint.path overlaps a path the operator mounts itself ({', '.join(RESERVED_MOUNT_PATHS)})",
        field=".checkpoint.path",
        check=lambda s: not any(overlaps(p, s.checkpoint.path) for p in RESERVED_MOUNT_PATHS),
    ),
)
