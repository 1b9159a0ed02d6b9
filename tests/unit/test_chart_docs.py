"""tools/chart_docs.py: a value whose row in the chart README's table has no description is reported
(make docs-check fails on it, and on a README that differs from what helm-docs makes now)."""

from __future__ import annotations

import chart_docs

TABLE = """## Values

| Key | Type | Default | Description |
|-----|------|---------|-------------|
| image.repository | string | `"rljob/operator"` | The operator image. |
| image.pullPolicy | string | `"IfNotPresent"` |  |
| resources | object | `{"limits":{"memory":"512Mi"}}` | Requests and limits; a | in a default is fine. |
| tolerations | list | `[]` |  |
"""


def test_values_without_a_description_are_named() -> None:
    assert chart_docs.undocumented(TABLE) == ["image.pullPolicy", "tolerations"]


def test_the_committed_readme_documents_every_value() -> None:
    assert chart_docs.undocumented(chart_docs.README.read_text()) == []
