"""README's sample of `rljob-runtime validate` is what validate prints for the config README quotes.

The config is README's short example with the change the sentence before the sample names; the
command runs in-process through the CLI's entry point (the same code path as the installed
`rljob-runtime`). A change to the example, to the rule's message or to validate's output fails here
until README is pasted again from a real run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_runtime.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
COMMAND = "$ rljob-runtime validate -c bad.yaml"


def _short_example(text: str) -> dict[str, Any]:
    block = re.search(r"## A short example\n\n```yaml\n(.*?)```", text, re.S)
    assert block, "README lost its short example"
    doc = yaml.safe_load(block.group(1))
    assert isinstance(doc, dict)
    return doc


def _sample(text: str) -> tuple[int, list[str]]:
    """(the batch size README says bad.yaml has, the lines README shows validate printing)."""
    change = re.search(r"With `rollout\.batchSize: (\d+)` above", text)
    assert change, "README no longer says how bad.yaml differs from the short example"
    block = re.search(rf"```\n{re.escape(COMMAND)}\n(.*?)```", text, re.S)
    assert block, f"README lost its `{COMMAND}` sample"
    return int(change.group(1)), block.group(1).splitlines()


def test_the_validate_sample_is_what_validate_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = README.read_text()
    batch_size, shown = _sample(text)
    doc = _short_example(text)
    doc["spec"]["rollout"]["batchSize"] = batch_size
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.chdir(tmp_path)

    status = main(["validate", "-c", "bad.yaml"])

    out = capsys.readouterr()
    assert status == 2
    assert (out.out + out.err).splitlines() == shown


def test_the_short_example_itself_is_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(_short_example(README.read_text()), sort_keys=False))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "-c", "good.yaml"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("qwen3-4b-math: valid\n")
