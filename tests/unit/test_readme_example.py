"""The README's short example is a job the API accepts (its rules run here as in the API server)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rljob_api.resource import parse_document

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_short_example_is_a_valid_job_whose_files_come_from_volumes() -> None:
    block = re.search(r"## A short example\n\n```yaml\n(.*?)```", README.read_text(), re.S)
    assert block, "README lost its short example"
    spec, metadata = parse_document(yaml.safe_load(block.group(1)))
    assert metadata["name"] == "qwen3-4b-math"
    mounts = [v.mount_path for v in spec.resources.volumes]
    assert any(spec.model.path.startswith(m + "/") for m in mounts)
    assert any(spec.data.path.startswith(m + "/") for m in mounts)
