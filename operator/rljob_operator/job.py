"""The operator's view of one RLTrainingJob: identity plus the validated spec."""

from __future__ import annotations

from collections.abc import Collection, Mapping
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


JobKey = tuple[str, str]  # (namespace, name)


class SpecCache:
    """Validated specs, one per job, reused while its uid and generation stay the same: the API server
    bumps the generation on every spec change, and validating the spec (pydantic) was about a tenth of
    the operator's CPU in a burst of jobs, where a job has a dozen passes and every pass of a namespace
    with a GPU quota reads every job of it. The specs are shared: nothing may change them."""

    def __init__(self) -> None:
        self._specs: dict[JobKey, tuple[str, int, RLTrainingJobSpec]] = {}

    def spec(self, obj: Mapping[str, Any]) -> RLTrainingJobSpec:
        meta = obj["metadata"]
        generation = meta.get("generation")
        if generation is None:  # never from the API server (it sets one on every object)
            return parse_spec(obj["spec"])
        key, stamp = (meta["namespace"], meta["name"]), (meta["uid"], int(generation))
        cached = self._specs.get(key)
        if cached is not None and cached[:2] == stamp:
            return cached[2]
        spec = parse_spec(obj["spec"])  # a SpecError is not kept: raised again at the next pass
        self._specs[key] = (*stamp, spec)
        return spec

    def forget(self, key: JobKey) -> None:
        self._specs.pop(key, None)

    def keep_only(self, keys: Collection[JobKey]) -> None:
        """Drop the specs of jobs not in `keys` (the resync's listing): one read by a quota pass just
        before the job's deletion was forgotten would otherwise stay."""
        for key in self._specs.keys() - set(keys):
            del self._specs[key]

    def jobs(self) -> set[JobKey]:
        return set(self._specs)


def job_from_object(obj: Mapping[str, Any], specs: SpecCache | None = None) -> Job:
    """A Job from the object the API server returned (already validated by the CRD schema); with
    `specs`, the spec is validated once per generation."""
    meta = obj["metadata"]
    created = meta.get("creationTimestamp")
    return Job(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=int(meta.get("generation", 1)),
        spec=specs.spec(obj) if specs is not None else parse_spec(obj["spec"]),
        created=datetime.fromisoformat(created.replace("Z", "+00:00"))
        if isinstance(created, str)
        else created,
        deleting=bool(meta.get("deletionTimestamp")),
        status=obj.get("status") or {},
        annotations=meta.get("annotations") or {},
    )
