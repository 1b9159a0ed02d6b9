"""Paths in the spec: the two forms the pods accept, as rules (CEL and Python), and comparison of
paths by whole segments.

An absolute path (a mount path, checkpoint.path, a hostPath) is '/' then names separated by single
'/'; a relative path (a subPath, a projected key's file) is names separated by single '/' below a
volume's root. Neither may hold a '..' segment: pod validation refuses it in a subPath or a hostPath,
and in any other path it would leave the directory the rest of the spec checks the path against.
"""

from __future__ import annotations

import re

from .rules import Rule

# '/' then names without ':' (pod validation refuses it in a mountPath) or NUL; no trailing '/'.
ABSOLUTE_PATH_PATTERN = r"^/([^/:\x00]+(/[^/:\x00]+)*)?$"
# Names without NUL separated by single '/'; no leading or trailing '/'.
RELATIVE_PATH_PATTERN = r"^[^/\x00]+(/[^/\x00]+)*$"

_FORMS = {
    "absolute": (
        ABSOLUTE_PATH_PATTERN,
        "must be an absolute path: '/' then names separated by single '/', without ':' or a trailing '/'",
    ),
    "relative": (
        RELATIVE_PATH_PATTERN,
        "must be a relative path inside the volume: names separated by single '/', without a leading or "
        "trailing '/'",
    ),
}


def has_dot_dot(path: str) -> bool:
    """Whether `path` has a '..' segment."""
    return ".." in path.split("/")


def no_dot_dot_cel(field: str) -> str:
    """CEL: `field` has no '..' segment (without the strings extension's split(), which not every
    CEL evaluator has)."""
    return (
        f"!({field} == '..' || {field}.startsWith('../') || {field}.endsWith('/..') || "
        f"{field}.contains('/../'))"
    )


def matches_cel(field: str, pattern: str) -> str:
    """CEL: `field` matches `pattern` (backslashes escaped for a CEL string)."""
    return f"{field}.matches('{pattern.replace(chr(92), chr(92) * 2)}')"


def path_rules(
    name: str, attr: str, *, form: str, label: str, example: str, optional: bool = False
) -> tuple[Rule, Rule]:
    """The form rule and the no-'..' rule of path field `name` (python `attr`) of one object.
    `form` is 'absolute' or 'relative'; `label` names the field in the messages."""
    pattern, meaning = _FORMS[form]
    field = f"self.{name}"
    guard = f"!has({field}) || " if optional else ""

    def value(obj: object) -> str | None:
        found = getattr(obj, attr)
        return None if found is None else str(found)

    def good_form(obj: object) -> bool:
        text = value(obj)
        return text is None or re.fullmatch(pattern, text) is not None

    def no_dot_dot(obj: object) -> bool:
        text = value(obj)
        return text is None or not has_dot_dot(text)

    dot_dot = (
        "it would lead out of the volume; write a path inside it"
        if form == "relative"
        else "write the directory it means without one"
    )
    return (
        Rule(
            cel=guard + matches_cel(field, pattern),
            message=f"{label} {meaning}, e.g. {example}",
            field=f".{name}",
            check=good_form,
        ),
        Rule(
            cel=guard + no_dot_dot_cel(field),
            message=f"{label} may not contain a '..' segment: {dot_dot}",
            field=f".{name}",
            check=no_dot_dot,
        ),
    )


def segments(path: str) -> list[str]:
    """The names of `path`, resolved lexically: empty and '.' segments dropped, '..' drops the name
    before it (never above the root)."""
    names: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if names:
                names.pop()
            continue
        names.append(part)
    return names


def is_within(path: str, root: str) -> bool:
    """Whether absolute `path` is `root` or lies below it, comparing whole segments after
    normalisation: '/mnt/nvme/x' is within '/mnt/nvme/', '/mnt/nvme-x' and '/mnt/nvme/../etc' are not.
    A relative path or root is within nothing."""
    if not (path.startswith("/") and root.startswith("/")):
        return False
    below, top = segments(path), segments(root)
    return below[: len(top)] == top
