"""The RLTrainingJob resource as a whole: names, the top-level object, and parsing with clear errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .base import ApiModel
from .errors import SpecError, problems_from
from .spec import RLTrainingJobSpec
from .status import RLTrainingJobStatus

GROUP = "rljob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLTrainingJob"
PLURAL = "rltrainingjobs"
SINGULAR = "rltrainingjob"
SHORT_NAMES = ("rljob", "rljobs")
CATEGORIES = ("all", "ml")
CRD_NAME = f"{PLURAL}.{GROUP}"

# KubeRay names the RayCluster "<rayjob>-<5 chars>" and its Services after that, and the RayJob is
# named after the job: a longer name is refused at admission (NAME_VALIDATION, at the CRD's root).
NAME_MAX = 47
_NAME_ADVICE = (
    f" characters; KubeRay allows at most {NAME_MAX} for the RayJob it runs on. "
    "Create the job again with a shorter name."
)
NAME_VALIDATION = {
    "rule": f"size(self.metadata.name) <= {NAME_MAX}",
    # No messageExpression: with it the schema's estimated CEL cost exceeds the API server's budget
    # and the whole CRD is refused. fieldPath needs metadata.name declared (crdgen does).
    "message": f"the name has more than {NAME_MAX}" + _NAME_ADVICE,
    "fieldPath": ".metadata.name",
    "reason": "FieldValueInvalid",
}


def name_problem(name: str) -> str | None:
    """NAME_VALIDATION's verdict in Python, with its message."""
    return None if len(name) <= NAME_MAX else str(NAME_VALIDATION["message"])


class RLTrainingJob(BaseModel):
    """A whole RLTrainingJob object as kubectl sees it."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["rljob.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["RLTrainingJob"]
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RLTrainingJobSpec
    status: RLTrainingJobStatus | None = None

    @property
    def name(self) -> str | None:
        return self.metadata.get("name")


def parse_spec(data: Any) -> RLTrainingJobSpec:
    """Validate a spec document (camelCase keys); raises SpecError naming every bad field."""
    if not isinstance(data, Mapping):
        raise SpecError([f"spec: expected a mapping of fields, got {type(data).__name__}"])
    try:
        return RLTrainingJobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from(exc, RLTrainingJobSpec)) from None


def parse_document(doc: Any) -> tuple[RLTrainingJobSpec, dict[str, Any]]:
    """A whole manifest (apiVersion/kind/metadata/spec) or a bare spec -> (spec, metadata)."""
    if not isinstance(doc, Mapping):
        raise SpecError([f"expected an RLTrainingJob manifest or its spec, got {type(doc).__name__}"])
    if "apiVersion" not in doc and "kind" not in doc:
        if isinstance(doc.get("spec"), Mapping):  # a manifest that lost its header, not a bare spec
            raise SpecError(
                [
                    f"a document with spec: but no apiVersion/kind: add 'apiVersion: {API_VERSION}' and "
                    f"'kind: {KIND}' (a manifest), or give the spec's fields at the top level (a bare spec)"
                ]
            )
        return parse_spec(doc), {}
    problems = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: expected {API_VERSION}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        problems.append(f"kind: expected {KIND}, got {doc.get('kind')!r}")
    if "spec" not in doc:
        problems.append("spec: required field is missing")
    if problems:
        raise SpecError(problems)
    metadata = doc.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    try:
        spec = parse_spec(doc["spec"])
    except SpecError as exc:
        raise SpecError(exc.problems, source=f'RLTrainingJob "{name}"' if name else KIND) from None
    return spec, dict(metadata)


def check_update(old: RLTrainingJobSpec, new: RLTrainingJobSpec) -> list[str]:
    """Immutability violations of changing `old` into `new`, in the API server's words."""
    return _transition_problems(old, new, "spec")


def _transition_problems(old: ApiModel, new: ApiModel, path: str) -> list[str]:
    problems = [
        f"{path}{rule.field}: {rule.message}"
        for rule in type(new).rules
        if rule.transition and not rule.check(old, new)
    ]
    for name, info in type(new).model_fields.items():
        before, after = getattr(old, name), getattr(new, name)
        if isinstance(before, ApiModel) and type(before) is type(after):
            problems += _transition_problems(before, after, f"{path}.{info.alias or name}")
    return problems
