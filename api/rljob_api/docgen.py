"""Generate docs/api-reference.md from the CRD schema (the same text `kubectl explain` shows).

python -m rljob_api.docgen --out docs/api-reference.md      (make docs)
python -m rljob_api.docgen --check docs/api-reference.md    (CI: fail when stale)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .base import ApiModel
from .crdgen import build_crd
from .rules import Rule


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    kind = node.get("type", "")
    if kind == "array":
        return f"[]{_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    return kind


def _rows(node: dict[str, Any], path: str) -> Iterator[tuple[str, str, str, str]]:
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        sub_path = f"{path}.{name}"
        default = sub.get("default")
        shown = (
            ""
            if default is None or default == {}
            else f"`{default if isinstance(default, str) else json.dumps(default)}`"
        )
        if name in required:
            shown = "**required**"
        description = " ".join(sub.get("description", "").split()).replace("|", "\\|")
        yield sub_path, _type(sub), shown, description
        target = sub["items"] if sub.get("type") == "array" else sub
        yield from _rows(target, sub_path + ("[]" if target is not sub else ""))


def _key(entry: dict[str, Any]) -> tuple[str, str]:
    return entry["rule"], entry["message"]


def _all_rules(cls: type[ApiModel] = ApiModel) -> dict[tuple[str, str], Rule]:
    found = {_key(rule.to_crd()): rule for rule in cls.rules}
    for sub in cls.__subclasses__():
        found.update(_all_rules(sub))
    return found


def _rule_rows(
    node: dict[str, Any], path: str, rules: dict[tuple[str, str], Rule]
) -> Iterator[tuple[str, str, str]]:
    for entry in node.get("x-kubernetes-validations", []):
        rule = rules[_key(entry)]
        kind = "immutable" if rule.transition else "rule"
        yield f"{path}{rule.field}", kind, rule.message.replace("|", "\\|")
    for name, sub in node.get("properties", {}).items():
        if sub.get("type") == "array":
            yield from _rule_rows(sub["items"], f"{path}.{name}[]", rules)
        else:
            yield from _rule_rows(sub, f"{path}.{name}", rules)


def render() -> str:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lines = [
        "# RLTrainingJob API reference (rljob.dev/v1alpha1)",
        "",
        "Generated from the pydantic models by `make docs`; do not edit. `kubectl explain rljob.spec` "
        "shows the same descriptions. Cross-field rules and immutable fields are listed in "
        "[Rules](#rules) below.",
        "",
    ]
    for part in ("spec", "status"):
        lines += [f"## {part}", "", "| field | type | default | description |", "|---|---|---|---|"]
        lines += [
            f"| `{p}` | {t} | {d} | {desc} |" for p, t, d, desc in _rows(schema["properties"][part], part)
        ]
        lines.append("")
    lines += [
        "## Rules",
        "",
        "Cross-field rules (CEL `x-kubernetes-validations` in the CRD, the same checks in "
        "`rljob-runtime validate`) and fields that cannot change once the job exists.",
        "",
        "| field | kind | message |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{p}` | {k} | {m} |" for p, k, m in _rule_rows(schema["properties"]["spec"], "spec", _all_rules())
    ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path)
    group.add_argument("--check", type=Path)
    args = parser.parse_args(argv)
    if args.out:
        args.out.write_text(render())
        return 0
    if not args.check.exists() or args.check.read_text() != render():
        print(f"{args.check} is stale: run `make docs` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
