"""Affinity of the job's pods: core/v1 Affinity, typed, so that a value the pod API would refuse (or
prune, or the scheduler could never satisfy) is refused when the job is applied, naming the field.

The rules mirror Kubernetes' pod validation (ValidateNodeSelectorRequirement,
ValidateNodeFieldSelectorRequirement, validatePodAffinityTerm, ValidateLabelSelector). Every list
and string is bounded: the API server estimates the cost of the CEL rules below from those bounds,
multiplied through the lists that hold them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, LabelKey, LabelName, LabelValue, Name, QualifiedName
from .rules import Rule
from .spec_pods import qualified_keys_rule

# strconv.ParseInt(v, 10, 64), as the scheduler parses a Gt/Lt value, within a label value (no sign);
# 18 digits always fit in an int64.
_INTEGER = "[0-9]{1,18}"

Values = Annotated[list[LabelValue], Field(max_length=64)]
QualifiedNames = Annotated[list[QualifiedName], Field(max_length=16)]
MatchLabels = Annotated[dict[LabelKey, LabelValue], Field(max_length=16)]


def _in_needs_values() -> Rule:
    return Rule(
        cel="!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        message="values must not be empty when operator is In or NotIn",
        field=".values",
        check=lambda r: r.operator not in ("In", "NotIn") or bool(r.values),
    )


def _exists_takes_no_values() -> Rule:
    return Rule(
        cel="!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
        message="values must be empty when operator is Exists or DoesNotExist",
        field=".values",
        check=lambda r: r.operator not in ("Exists", "DoesNotExist") or not r.values,
    )


class NodeSelectorRequirement(ApiModel):
    """A node label requirement (core/v1 NodeSelectorRequirement)."""

    rules = (
        _in_needs_values(),
        _exists_takes_no_values(),
        Rule(
            cel="!(self.operator in ['Gt', 'Lt']) || "
            f"(has(self.values) && size(self.values) == 1 && self.values[0].matches('^{_INTEGER}$'))",
            message="values must be exactly one integer (e.g. '8') when operator is Gt or Lt",
            field=".values",
            check=lambda r: (
                r.operator not in ("Gt", "Lt")
                or (
                    r.values is not None
                    and len(r.values) == 1
                    and re.fullmatch(_INTEGER, r.values[0]) is not None
                )
            ),
        ),
    )

    key: QualifiedName = Field(description="Node label key, e.g. topology.kubernetes.io/zone.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt (Gt and Lt compare the label as an integer)."
    )
    values: Values | None = Field(
        default=None,
        description="Label values: at least one for In and NotIn, none for Exists and DoesNotExist, "
        "one integer for Gt and Lt.",
    )


class NodeFieldSelectorRequirement(ApiModel):
    """A node field requirement (core/v1 NodeSelectorRequirement in matchFields): one node name."""

    key: Literal["metadata.name"] = Field(description="Node field; only metadata.name.")
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn.")
    values: Annotated[list[Name], Field(min_length=1, max_length=1)] = Field(
        description="Exactly one node name."
    )


class NodeSelectorTerm(ApiModel):
    """Requirements that a node must all meet (core/v1 NodeSelectorTerm)."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=16)] | None = Field(
        default=None, description="Requirements on node labels."
    )
    match_fields: Annotated[list[NodeFieldSelectorRequirement], Field(max_length=16)] | None = Field(
        default=None, description="Requirements on node fields (metadata.name)."
    )


class NodeSelector(ApiModel):
    """Node selector terms, of which a node must meet at least one (core/v1 NodeSelector)."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=16)] = Field(
        description="Terms, ORed: a node matches when it meets one of them."
    )


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference (core/v1 PreferredSchedulingTerm)."""

    weight: int = Field(ge=1, le=100, description="Weight, 1-100, added to a node's score when it matches.")
    preference: NodeSelectorTerm = Field(description="The node requirements preferred.")


class NodeAffinity(ApiModel):
    """Node affinity (core/v1 NodeAffinity)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on."
    )
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=16)] | None
    ) = Field(default=None, description="Nodes the pods prefer, by weight.")


class LabelSelectorRequirement(ApiModel):
    """A label requirement (meta/v1 LabelSelectorRequirement)."""

    rules = (_in_needs_values(), _exists_takes_no_values())

    key: QualifiedName = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: Values | None = Field(
        default=None,
        description="Label values: at least one for In and NotIn, none for Exists and DoesNotExist.",
    )


_MATCH_LABELS_KEYS = qualified_keys_rule("matchLabels", "match_labels")


class LabelSelector(ApiModel):
    """A label selector (meta/v1 LabelSelector): requirements ANDed; empty selects everything."""

    rules = (
        dataclasses.replace(
            _MATCH_LABELS_KEYS, check=lambda s: s.match_labels is None or _MATCH_LABELS_KEYS.check(s)
        ),
    )

    match_labels: MatchLabels | None = Field(default=None, description="Labels that must equal these values.")
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] | None = Field(
        default=None, description="Requirements on labels."
    )


def _label_keys_need_selector(name: str, attr: str) -> Rule:
    return Rule(
        cel=f"!has(self.{name}) || size(self.{name}) == 0 || has(self.labelSelector)",
        message=f"{name} must not be set without labelSelector",
        field=f".{name}",
        check=lambda t: not getattr(t, attr) or t.label_selector is not None,
    )


def _keys_of(selector: LabelSelector | None) -> set[str]:
    if selector is None:
        return set()
    return set(selector.match_labels or {}) | {e.key for e in selector.match_expressions or []}


class PodAffinityTerm(ApiModel):
    """Pods, by labels and namespaces, whose topology domain to share or avoid (core/v1 PodAffinityTerm)."""

    rules = (
        _label_keys_need_selector("matchLabelKeys", "match_label_keys"),
        _label_keys_need_selector("mismatchLabelKeys", "mismatch_label_keys"),
        Rule(
            cel="!has(self.matchLabelKeys) || !has(self.mismatchLabelKeys) || "
            "!self.matchLabelKeys.exists(k, k in self.mismatchLabelKeys)",
            message="matchLabelKeys: a key may not also be in mismatchLabelKeys",
            field=".matchLabelKeys",
            check=lambda t: not set(t.match_label_keys or ()) & set(t.mismatch_label_keys or ()),
        ),
        Rule(
            cel="!has(self.matchLabelKeys) || !has(self.labelSelector) || !self.matchLabelKeys.exists(k, "
            "(has(self.labelSelector.matchLabels) && k in self.labelSelector.matchLabels) || "
            "(has(self.labelSelector.matchExpressions) && self.labelSelector.matchExpressions.exists(e, e.key == k)))",
            message="matchLabelKeys: a key may not also be in labelSelector (matchLabelKeys adds it there)",
            field=".matchLabelKeys",
            check=lambda t: not set(t.match_label_keys or ()) & _keys_of(t.label_selector),
        ),
    )

    label_selector: LabelSelector | None = Field(
        default=None, description="Pods to match; unset matches none."
    )
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Namespaces of the pods to match, by label, added to namespaces ({} selects all); "
        "with neither set, the job's namespace.",
    )
    namespaces: Annotated[list[LabelName], Field(max_length=32)] | None = Field(
        default=None, description="Namespaces of the pods to match."
    )
    topology_key: QualifiedName = Field(
        description="Node label whose value defines the domain, e.g. kubernetes.io/hostname or "
        "topology.kubernetes.io/zone."
    )
    match_label_keys: QualifiedNames | None = Field(
        default=None,
        description="Pod label keys whose values (from the new pod) are added to labelSelector as In.",
    )
    mismatch_label_keys: QualifiedNames | None = Field(
        default=None,
        description="Pod label keys whose values (from the new pod) are added to labelSelector as NotIn.",
    )


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference (core/v1 WeightedPodAffinityTerm)."""

    weight: int = Field(ge=1, le=100, description="Weight, 1-100, added to a node's score when it matches.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term preferred.")


PodAffinityTerms = Annotated[list[PodAffinityTerm], Field(max_length=16)]
WeightedPodAffinityTerms = Annotated[list[WeightedPodAffinityTerm], Field(max_length=16)]


class PodAffinity(ApiModel):
    """Pods to run near (core/v1 PodAffinity)."""

    required_during_scheduling_ignored_during_execution: PodAffinityTerms | None = Field(
        default=None, description="Terms the pods must all meet."
    )
    preferred_during_scheduling_ignored_during_execution: WeightedPodAffinityTerms | None = Field(
        default=None, description="Terms the pods prefer, by weight."
    )


class PodAntiAffinity(PodAffinity):
    """Pods to keep away from (core/v1 PodAntiAffinity): the same fields as PodAffinity."""


class Affinity(ApiModel):
    """Scheduling constraints of the job's pods (core/v1 Affinity)."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Nodes the pods run on.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pods to run near.")
    pod_anti_affinity: PodAntiAffinity | None = Field(default=None, description="Pods to keep away from.")
