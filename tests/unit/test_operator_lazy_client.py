"""lazy_client.py: the operator's process imports kubernetes_asyncio's generated classes one by one,
as it uses them, instead of all of them at start. Run in a fresh interpreter (this one has the real
client imported already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[2] / "operator"

LAZY = """
import asyncio, json, sys
from rljob_operator import lazy_client
lazy_client.install()
import kopf
from rljob_operator import handlers, kube
from kubernetes_asyncio import client

async def main():
    k = kube.Kube()  # the four API classes and the ApiClient
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="u"))
    body = k.api.sanitize_for_serialization(options)
    await k.close()
    return body

body = asyncio.run(main())
try:
    client.NoSuchThing
    missing = False
except AttributeError:
    missing = True
models = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
print(json.dumps({
    "installed": lazy_client.installed(),
    "body": body,
    "models": len(models),
    "exports": sorted(client.__all__ + client.models.__all__ + client.api.__all__),
    "real_class": client.V1DeleteOptions.__module__,
    "missing": missing,
}))
"""

REAL = """
import json
from kubernetes_asyncio import client
names = [n for m in (client, client.models, client.api) for n in dir(m) if not n.startswith("_")]
print(json.dumps(sorted(names)))
"""


def _run(code: str) -> object:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(OPERATOR)},
    )
    return json.loads(out.stdout)


def test_the_operator_imports_only_the_models_it_uses_and_sees_every_name() -> None:
    lazy = _run(LAZY)
    assert isinstance(lazy, dict)
    assert lazy["installed"] and lazy["missing"]
    assert lazy["body"] == {"preconditions": {"uid": "u"}}
    assert lazy["real_class"] == "kubernetes_asyncio.client.models.v1_delete_options"
    assert lazy["models"] < 10  # of about 800: kopf's two, the delete options
    real = _run(REAL)
    assert isinstance(real, list)
    assert len(lazy["exports"]) > 1500 and set(lazy["exports"]) <= set(real)
