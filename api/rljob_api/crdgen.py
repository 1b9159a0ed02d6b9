"""Generate the RLTrainingJob CustomResourceDefinition from the pydantic models.

`python -m rljob_api.crdgen --out crds` writes crds/rltrainingjobs.rljob.dev.yaml;
`--check crds` fails when the file differs from what the models generate (CI runs it).

Pydantic emits JSON Schema (2020-12); Kubernetes wants a *structural* OpenAPI v3.0 schema: no
$ref, no nullable anyOf, boolean exclusiveMinimum, no `additionalProperties: false`, every
object's properties spelled out. `to_structural` does that translation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from .resource import (
    API_VERSION,
    CATEGORIES,
    CRD_NAME,
    GROUP,
    KIND,
    NAME_VALIDATIONS,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from .spec import RLTrainingJobSpec
from .status import RLTrainingJobStatus

CRD_FILE = f"{CRD_NAME}.yaml"

# Keywords copied as they are (OpenAPI v3.0 and JSON Schema agree on them).
_KEEP = (
    "type",
    "format",
    "description",
    "default",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
)

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {
        # As Tekton's REASON: a stuck job reads as stuck (ImagePullBackOff, Unschedulable, ...)
        # without -o wide or describe.
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "description": "Why the job is in its phase; for a stuck job, what blocks it "
        "(ImagePullBackOff, Unschedulable, QuotaTooSmall, PermissionDenied).",
    },
    {
        "name": "Step",
        "type": "string",
        "jsonPath": ".status.progress.stepText",
        "description": "Rollout steps done / total.",
    },
    {
        "name": "Reward",
        "type": "number",
        "jsonPath": ".status.progress.rewardMean",
        "description": "Mean reward of the last rollout step.",
    },
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus", "description": "GPUs requested."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Model",
        "type": "string",
        "jsonPath": ".spec.model.path",
        "priority": 1,
        "description": "Model being trained.",
    },
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts",
        "priority": 1,
        "description": "Times the job was restarted on a new Ray job after a retriable failure.",
    },
    {
        "name": "Message",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].message',
        "priority": 1,
        "description": "What the job is doing, or what is wrong.",
    },
]


def to_structural(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema as a structural OpenAPI v3.0 schema (refs inlined)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = _convert(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        # The field's own description and default win over the referenced class's.
        overrides = {
            k: v for k, v in node.items() if k in ("description", "default") or k.startswith("x-kubernetes-")
        }
        return {**target, **overrides}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} in a structural schema")
        # Field-level keywords (description, default, x-kubernetes-*) sit beside the anyOf.
        outer = {k: v for k, v in node.items() if k != "anyOf" and v is not None}
        return _convert({**branches[0], **outer}, defs)
    out: dict[str, Any] = {k: node[k] for k in _KEEP if k in node}
    if out.get("default", 0) is None:
        del out["default"]
    if "const" in node:
        out["enum"] = [node["const"]]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node:  # JSON Schema's number form -> OpenAPI v3.0's boolean form
            out[plain] = node[bound]
            out[bound] = True
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: _convert(v, defs) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(node["additionalProperties"], defs)
    if "items" in node:
        out["items"] = _convert(node["items"], defs)
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            out[key] = value
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("maxLength", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
    bounds = bounds_sentence(out)
    if bounds and "description" in out:  # kubectl explain shows the description, not the schema's bounds
        out["description"] = f"{out['description'].rstrip()} {bounds}"
    return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)


def bounds_sentence(schema: dict[str, Any]) -> str:
    """'Minimum 1, maximum 64.' for a number's schema (OpenAPI v3.0 form); '' without bounds."""
    if schema.get("type") not in ("integer", "number"):
        return ""
    parts = []
    if "minimum" in schema:
        word = "greater than" if schema.get("exclusiveMinimum") else "minimum"
        parts.append(f"{word} {_number(schema['minimum'])}")
    if "maximum" in schema:
        word = "less than" if schema.get("exclusiveMaximum") else "maximum"
        parts.append(f"{word} {_number(schema['maximum'])}")
    return (", ".join(parts).capitalize() + ".") if parts else ""


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec = to_structural(RLTrainingJobSpec)
    status = to_structural(RLTrainingJobStatus)
    schema = {
        "type": "object",
        "description": f"{KIND} runs reinforcement-learning post-training (GRPO, GSPO, REINFORCE++, PPO) "
        "of an LLM: a Megatron or torch trainer plus SGLang rollout engines on a KubeRay RayJob.",
        "required": ["spec"],
        "x-kubernetes-validations": list(NAME_VALIDATIONS),
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"The versioned schema of this object: {API_VERSION}.",
            },
            "kind": {"type": "string", "description": f"The kind of this object: {KIND}."},
            # Declared so the name rules can name their field (the API server allows only name and
            # generateName here).
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 253}}},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "rljob", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


class _NoAliasDumper(yaml.SafeDumper):
    """Write shared sub-schemas out in full: kubectl explain and people read this file, not anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    header = "# Generated by `make crds` (python -m rljob_api.crdgen) from api/rljob_api. Do not edit.\n"
    return header + yaml.dump(
        build_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=100, allow_unicode=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="directory to write the CRD into")
    group.add_argument("--check", type=Path, help="directory whose CRD must match the models")
    args = parser.parse_args(argv)
    text = render()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / CRD_FILE).write_text(text)
        print(f"wrote {args.out / CRD_FILE}")
        return 0
    path = args.check / CRD_FILE
    if not path.exists() or path.read_text() != text:
        print(f"{path} is stale: run `make crds` and commit the result", file=sys.stderr)
        return 1
    print(f"{path} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
