"""YAML read as kubectl reads it, so `rljob-runtime validate` sees the numbers the API server sees.

PyYAML follows YAML 1.1, where a float needs a dot: `lr: 1e-6` is the string "1e-6" there, but a
number to kubectl (go-yaml). With the models' strict types a string is refused where a number is
due, so manifests are read with kubectl's float rule added (ints still resolve first).
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class KubectlYamlLoader(yaml.SafeLoader):
    """SafeLoader plus go-yaml's plain float form: 1e-6, 1E+3, .5, -2.5e-3."""


KubectlYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def load(text: str) -> Any:
    return yaml.load(text, Loader=KubectlYamlLoader)  # a SafeLoader: no arbitrary objects


def load_all(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=KubectlYamlLoader))
