"""Jobs whose model.path is a hub id, on the real API server, the real KubeRay and the local Ray: the
first job downloads the model and trains on it, a second job of the same model downloads nothing,
and a gated model without a token fails the job with the runtime's one-line reason in its status.

Two stand-ins, both named: the hub is tests/hub_server.py (its HTTP layout on a local port: the
public hub is out of reach), and, since kwok pods run no containers, the pod's environment
(HF_ENDPOINT from resources.env, HF_HOME on the model cache volume) is set on the entrypoint that
the local Ray runs, through the rljob.dev/entrypoint annotation. The RayJob's pods are checked for
the real mounts (the model cache claim and the token file) by test_job_pods.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_server import HubStandIn
from operator_process import OperatorProcess
from test_operator import condition, in_phase, tiny_training_job, wait_for

from rljob_api.contract import ENTRYPOINT
from rljob_runtime.models.tiny_model import make_tiny_model

pytestmark = pytest.mark.e2e

WEIGHTS = "/resolve/"  # what a file download requests


@pytest.fixture(scope="module")
def operator(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    model = make_tiny_model(tmp_path_factory.mktemp("hub") / "tiny", arch="llama", seed=0)
    with HubStandIn() as server:
        server.add_repo("org/tiny", model)
        server.add_repo("org/gated", model, gated=True)
        yield server


def _hub_job(tmp_path: Path, name: str, namespace: str, repo: str, hub: HubStandIn, cache: Path) -> Any:
    doc = tiny_training_job(tmp_path / name, name, namespace, num_rollout=1)
    doc["spec"]["model"]["path"] = repo
    doc["spec"]["resources"]["env"] = [{"name": "HF_ENDPOINT", "value": hub.url}]
    # The pod's environment, which the local Ray does not get from the (kwok) head pod.
    doc["metadata"]["annotations"] = {
        "rljob.dev/entrypoint": f"HF_ENDPOINT={hub.url} HF_HOME={cache} {ENTRYPOINT}"
    }
    return doc


def _downloads(hub: HubStandIn, since: int) -> list[str]:
    return [path for method, path in hub.requests[since:] if method == "GET" and WEIGHTS in path]


def test_a_hub_model_is_downloaded_once_and_trained_on(
    crd: Any, operator: OperatorProcess, namespace: str, hub: HubStandIn, tmp_path: Path
) -> None:
    cache = tmp_path / "model-cache"  # one cache for both jobs, as resources.modelCache shares one claim
    mark = len(hub.requests)
    crd.apply(_hub_job(tmp_path, "hub-first", namespace, "org/tiny", hub, cache))
    first = wait_for(
        "the first job to finish",
        in_phase(crd, namespace, "hub-first", "Succeeded", "Failed"),
        operator,
        timeout=420,
    )
    assert first["phase"] == "Succeeded", json.dumps(first, indent=1)
    fetched = _downloads(hub, mark)
    assert any(path.endswith("/model.safetensors") for path in fetched), fetched
    assert (cache / "hub" / "models--org--tiny" / "snapshots").is_dir()
    assert "message" not in first["progress"]  # the download line went with the first step

    mark = len(hub.requests)
    crd.apply(_hub_job(tmp_path, "hub-again", namespace, "org/tiny", hub, cache))
    again = wait_for(
        "the second job to finish",
        in_phase(crd, namespace, "hub-again", "Succeeded", "Failed"),
        operator,
        timeout=420,
    )
    assert again["phase"] == "Succeeded", json.dumps(again, indent=1)
    assert _downloads(hub, mark) == []  # the cached revision: only where main points now was asked


def test_a_gated_model_without_a_token_fails_the_job_saying_what_to_set(
    crd: Any, operator: OperatorProcess, namespace: str, hub: HubStandIn, tmp_path: Path
) -> None:
    mark = len(hub.requests)
    crd.apply(_hub_job(tmp_path, "hub-gated", namespace, "org/gated", hub, tmp_path / "cache"))
    st = wait_for(
        "the gated job to fail",
        in_phase(crd, namespace, "hub-gated", "Succeeded", "Failed"),
        operator,
        timeout=300,
    )
    assert st["phase"] == "Failed", json.dumps(st, indent=1)
    ready = condition(st, "Ready")["message"]
    assert "model.path org/gated@main is gated: set resources.secrets.huggingFaceToken" in ready, ready
    assert _downloads(hub, mark) == []
