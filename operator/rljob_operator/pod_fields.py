"""The job field behind each volume of its pods, so that a refusal of the pods (PodSecurity, a
webhook, a policy engine) names what the user wrote, not what the operator built (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rljob_api.pod_paths import CHECKPOINT_VOLUME, HF_TOKEN_VOLUME, MODEL_CACHE_VOLUME, SHM_VOLUME
from rljob_api.spec import RLTrainingJobSpec

# PodSecurity's words: 'hostPath volumes (volume "data")', 'restricted volume types (volumes "a",
# "b" use ...)'; other admission messages quote a volume as 'volume "data"' too.
_NAMED = re.compile(r'\bvolumes? ((?:"[^"]+"(?:, )?)+)')
_QUOTED = re.compile(r'"([^"]+)"')


def volume_fields(spec: RLTrainingJobSpec) -> dict[str, str]:
    """{pod volume name: the job field it comes from} (build_pods._volumes names them)."""
    fields = {
        CHECKPOINT_VOLUME: "spec.checkpoint.volume" if spec.checkpoint.volume else "spec.checkpoint.path",
        MODEL_CACHE_VOLUME: "spec.resources.modelCache",
        HF_TOKEN_VOLUME: "spec.resources.secrets.huggingFaceToken",
        SHM_VOLUME: "spec.resources.shmSize",
    }
    for index, volume in enumerate(spec.resources.volumes):
        fields[volume.name] = f"spec.resources.volumes[{index}] ({volume.name})"
    return fields


def fields_named(detail: str, fields: Mapping[str, str]) -> list[str]:
    """The job fields behind the volumes a refusal names, in the order it names them."""
    found: list[str] = []
    for group in _NAMED.finditer(detail):
        for name in _QUOTED.findall(group.group(1)):
            field = fields.get(name)
            if field is not None and field not in found:
                found.append(field)
    return found
