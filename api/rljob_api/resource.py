"""The RLTrainingJob resource as a whole: names, the top-level object, and parsing with clear errors."""

from __future__ import annotations

import json
import re
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
# named after the job: KubeRay refuses a RayJob name that is not a DNS-1035 label of at most 47
# characters. Such names are refused at admission (NAME_VALIDATIONS, at the CRD's root).
NAME_MAX = 47
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # a DNS-1035 label
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
NAME_FORM_VALIDATION = {
    "rule": f"self.metadata.name.matches('{NAME_PATTERN}')",
    "message": "the name must be a DNS-1035 label: lowercase letters, digits and '-', beginning with a letter "
    "and ending with a letter or digit (no '.'), as KubeRay wants for the RayJob and the Services named after "
    "the job. Create the job again with such a name.",
    "fieldPath": ".metadata.name",
    "reason": "FieldValueInvalid",
}
NAME_VALIDATIONS = (NAME_VALIDATION, NAME_FORM_VALIDATION)


def name_problems(name: str) -> list[str]:
    """NAME_VALIDATIONS' verdicts in Python, with their messages (empty when the name is fine)."""
    problems = []
    if len(name) > NAME_MAX:
        problems.append(str(NAME_VALIDATION["message"]))
    if re.fullmatch(NAME_PATTERN, name) is None:  # RE2's '$' is the end of the text, as fullmatch
        problems.append(str(NAME_FORM_VALIDATION["message"]))
    return problems


def name_problem(name: str) -> str | None:
    """The first of name_problems, None when the name is fine."""
    return next(iter(name_problems(name)), None)


# The API server refuses a request body over 3 MiB (its --max-request-body-bytes default, which
# custom resources get): the largest RLTrainingJob `kubectl apply` can send. etcd's own default
# (1.5 MiB per object) and the operator's RayJob limit (checks.RAYJOB_BYTES_MAX) are lower.
REQUEST_BYTES_MAX = 3 * 1024 * 1024


def document_bytes(doc: Any) -> int:
    """The size of `doc` as JSON, as kubectl sends it."""
    return len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def size_problem(doc: Any) -> str | None:
    """Why the API server would refuse `doc` (a manifest or its spec) for its size, None if it would not."""
    size = document_bytes(doc)
    if size <= REQUEST_BYTES_MAX:
        return None
    return (
        f"the job is {size} bytes as JSON, over the {REQUEST_BYTES_MAX} bytes (3 MiB) the API server accepts "
        "in one request: move large values (resources.env, model.chatTemplate, annotations) into a "
        "ConfigMap or Secret (env valueFrom, resources.volumes)"
    )


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
