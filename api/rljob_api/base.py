"""Building blocks shared by every API model: camelCase aliases, bounded types, sections.

Every string, list and map in the API is bounded (maxLength / maxItems / maxProperties) because
the API server estimates the cost of CEL rules from those bounds and refuses unbounded ones.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from .rules import Rule

# Kubernetes' own quantity pattern (from k8s.io/apimachinery resource.Quantity's CRD schema),
# without the leading '-': every quantity here is a size or an amount, which pod validation
# refuses when negative.
QUANTITY_PATTERN = r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A container image reference as the kubelet parses it (distribution/reference): an optional
# registry host[:port], lowercase path components, an optional tag and an optional digest.
IMAGE_PATTERN = (
    r"^(([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"(:[0-9]+)?/)?[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


class ApiModel(BaseModel):
    """Base of all API models: camelCase in YAML, unknown fields refused, validated on assignment,
    strict types as the API server has them (no '8' for 8, no 1 for true; an integer is a number)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        validate_assignment=True,
        strict=True,
    )

    # Cross-field rules of this object: CEL in the CRD, the same check here (see rules.py).
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        failed = [
            (rule.field, rule.message)
            for rule in type(self).rules
            if not rule.transition and not rule.check(self)
        ]
        if failed:
            raise PydanticCustomError(
                "rljob_rule",
                "{summary}",
                {"summary": "; ".join(f"{f.lstrip('.')}: {m}" for f, m in failed), "violations": failed},
            )
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler.resolve_ref_schema(handler(core_schema))
        # Factory defaults are invisible to pydantic's schema; the CRD needs them so the API server
        # fills the same defaults as Python. A nested section's default is spelled out in full: the
        # API server checks defaults against the section's CEL rules without defaulting inside them.
        for name, info in cls.model_fields.items():
            if info.default_factory is None:
                continue
            value = info.get_default(call_default_factory=True)
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json", by_alias=True, exclude_none=True)
            schema["properties"][info.alias or name]["default"] = value
        if cls.rules:
            schema["x-kubernetes-validations"] = [rule.to_crd() for rule in cls.rules]
        return schema


def _int_or_str(value: Any) -> Any:
    # Quantities may be written as YAML numbers (cpu: 4); Kubernetes stores them as int-or-string.
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string like '500m' or '16Gi', not a boolean")
    if isinstance(value, int | float):
        return str(value)
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_int_or_str),
    Field(
        pattern=QUANTITY_PATTERN,
        max_length=64,
        # pydantic leaves `pattern` out of the JSON schema when a BeforeValidator is present: restate it.
        json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN},
    ),
]
"""A Kubernetes resource quantity, e.g. 4, "500m", "16Gi"."""

Name = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""A Kubernetes object name (DNS subdomain)."""

LabelName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
"""A DNS label (names of queues, datasets, ...)."""

ShortText = Annotated[str, Field(max_length=256)]
Path = Annotated[str, Field(min_length=1, max_length=4096)]
"""A file system path, URL or Hugging Face hub id."""

ImportPath = Annotated[str, Field(max_length=512, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]
"""A Python callable as 'package.module:function' (the runtime imports it before starting)."""

# Pod validation's qualified name (labels, annotations, taint keys): an optional DNS-subdomain
# prefix and '/', then 1-63 alphanumerics with '-', '_' or '.' inside.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
QualifiedName = Annotated[str, Field(min_length=1, max_length=317, pattern=QUALIFIED_NAME_PATTERN)]
# As a map key: the CRD cannot constrain keys, so the owning model checks them with a rule
# (spec_pods.qualified_keys_rule), giving the API server and Python the same message.
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def section(model: type[BaseModel], description: str) -> Any:
    """A nested object that is always present: it defaults to its own defaults."""
    return Field(default_factory=model, description=description)
