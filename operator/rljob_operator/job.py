"""The operator's view of one RLTrainingJob: identity plus the validated spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rljob_api.resource import API_VERSION, KIND, parse_spec
from rljob_api.spec import RLTrainingJobSpec


@dataclass(frozen=True)
class Job:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: RLTrainingJobSpec
    created: datetime | None = None
    deleting: bool = False
    status: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def owner_reference(self) -> dict[str, Any]:
        """Makes children garbage-collected with the job (and shown as its children)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def owns(self, child: Mapping[str, Any]) -> bool:
        """Whether `child` is this job's, not one left by an earlier job of the same name (deleted
        and created again) that garbage collection has not removed yet."""
        owners = (child.get("metadata") or {}).get("ownerReferences") or []
        controller = [ref for ref in owners if ref.get("controller")]
        return not controller or any(ref.get("uid") == self.uid for ref in controller)


def job_from_object(obj: Mapping[str, Any]) -> Job:
    """A Job from the object the API server returned (already validated by the CRD schema)."""
    meta = obj["metadata"]
    created = meta.get("creationTimestamp")
    return Job(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=int(meta.get("generation", 1)),
        spec=parse_spec(obj["spec"]),
        created=datetime.fromisoformat(created.replace("Z", "+00:00"))
        if isinstance(created, str)
        else created,
        deleting=bool(meta.get("deletionTimestamp")),
        status=obj.get("status") or {},
        annotations=meta.get("annotations") or {},
    )
