"""`rljob-runtime validate` refuses a job the API server would refuse for its size: every field within
its bounds, but the whole request over the API server's 3 MiB (the e2e CRD tests check that number
against a real API server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rljob_api.resource import API_VERSION, KIND, REQUEST_BYTES_MAX, document_bytes
from rljob_runtime.cli import main

from spec_cases import patched

VALUE_MAX = 32768  # an env value's maxLength


def manifest_of(size: int) -> dict[str, Any]:
    """A valid manifest of about `size` bytes as JSON: env values at their bound, in two groups."""
    count = size // (VALUE_MAX + 40)
    env = [{"name": f"BIG_{i}", "value": "x" * VALUE_MAX} for i in range(count)]
    spec = patched({"resources": {"env": env[:64], "head": {"env": env[64:128]}}})
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "big"}, "spec": spec}


def _validate(tmp_path: Path, doc: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    code = main(["validate", "-c", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_job_over_the_request_limit_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = manifest_of(REQUEST_BYTES_MAX + 100_000)
    assert document_bytes(doc) > REQUEST_BYTES_MAX
    code, out = _validate(tmp_path, doc, capsys)
    assert code == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"rljob-runtime: invalid config: the job is {document_bytes(doc)} bytes as JSON")
    assert "over the 3145728 bytes (3 MiB) the API server accepts" in last


def test_a_large_job_under_the_limit_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = manifest_of(REQUEST_BYTES_MAX - 200_000)
    assert REQUEST_BYTES_MAX - 300_000 < document_bytes(doc) <= REQUEST_BYTES_MAX
    code, out = _validate(tmp_path, doc, capsys)
    assert code == 0, out
