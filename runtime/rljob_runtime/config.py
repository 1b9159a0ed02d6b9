"""The runtime's configuration: an RLTrainingJob manifest or its bare spec, validated by the same
models (and so the same rules and messages) as the CRD, before anything starts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rljob_api import yaml_load
from rljob_api.errors import SpecError
from rljob_api.metadata import metadata_problems
from rljob_api.resource import KIND, parse_document, size_problem
from rljob_api.spec import RLTrainingJobSpec


class ConfigError(SpecError):
    """A config file that cannot be used; its message names every bad field."""


@dataclass(frozen=True)
class RuntimeConfig:
    """A validated job: the spec plus who it is (name/namespace are absent for a bare spec)."""

    spec: RLTrainingJobSpec
    name: str | None = None
    namespace: str | None = None
    source: str = "<memory>"
    uid: str | None = None


def load_config(path: str | Path) -> RuntimeConfig:
    """Read and validate a YAML/JSON file holding an RLTrainingJob (or only its spec); `env:NAME`
    reads the document from an environment variable instead (how the operator hands it over)."""
    if isinstance(path, str) and path.startswith("env:"):
        name = path[4:]
        text = os.environ.get(name)
        if text is None:
            raise ConfigError([f"environment variable {name} is not set"], source=path)
        try:
            doc = yaml_load.load(text)
        except yaml.YAMLError as exc:
            raise ConfigError([f"{name}: not valid YAML/JSON: {exc}"], source=path) from None
        return config_from_document(doc, source=path)
    path = Path(path)
    try:
        # kubectl's reading of numbers (1e-6 is a float), for the models' strict types
        docs = [d for d in yaml_load.load_all(path.read_text()) if d is not None]
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"], source=str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"], source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot be read: {exc}"], source=str(path)) from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(jobs) > 1:
        raise ConfigError([f"{path}: holds {len(jobs)} {KIND} documents; give one"], source=str(path))
    if not jobs and len(docs) != 1:
        raise ConfigError(
            [f"{path}: expected one {KIND} or one spec, found {len(docs)} documents"], source=str(path)
        )
    return config_from_document(jobs[0] if jobs else docs[0], source=str(path))


def config_from_document(doc: Any, source: str = "<memory>") -> RuntimeConfig:
    too_large = size_problem(doc)
    if too_large:  # the API server refuses the whole request before it reads a field
        raise ConfigError([too_large], source=source)
    try:
        spec, metadata = parse_document(doc)
    except SpecError as exc:
        raise ConfigError(exc.problems, source=f"{source}: {exc.source}") from None
    naming = metadata_problems(metadata) if isinstance(doc, dict) and "kind" in doc else []
    if naming:  # a manifest: its name and namespace as the API server checks them
        raise ConfigError(naming, source=source)
    return RuntimeConfig(
        spec=spec,
        name=metadata.get("name"),
        namespace=metadata.get("namespace"),
        source=source,
        uid=metadata.get("uid"),
    )
