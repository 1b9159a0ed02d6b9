"""The runtime's status client reads $KUBECONFIG when it reports, not when the kubernetes client was
first imported (a process, or a test session, that imported it under another value)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from rljob_runtime.report import _status_api


def test_the_kubeconfig_of_now_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubernetes.config  # imported first, under another $KUBECONFIG

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert str(path) != kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _status_api()
    assert client.Configuration.get_default_copy().host == "https://127.0.0.1:6"
