"""The chart's other install shapes with the chart's own identity: the namespaced mode (a Role per
served namespace, and the per-namespace Secret pre-flight), and upgrade then uninstall."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from chart_install import helm
from chart_render import CHART
from test_chart import RESTRICTED, Install, _namespace
from test_operator import _in, condition, in_phase, job, status, wait_for

pytestmark = pytest.mark.e2e


def test_namespaced_install_serves_its_namespaces_only_and_checks_secrets_there(
    crd: Any, tmp_path: Path
) -> None:
    system = _namespace(crd, "rljob-ns", RESTRICTED)
    served, other = _namespace(crd, "served"), _namespace(crd, "other")
    install = Install(
        crd, "scoped", system, tmp_path,
        "--set=namespaceMode=namespaced", f"--set=watchNamespaces={{{served}}}",
        "--set=operator.secretPreflight=true",
    )  # fmt: skip
    try:
        assert f"--namespace={served}" in install.operator.args
        crd.apply(_in(served, job("mine")), _in(other, job("theirs")))
        spec = {"resources": {"secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}}}}
        crd.apply(_in(served, job("needs-hf", spec)))
        wait_for("mine Running", in_phase(crd, served, "mine", "Running"), install.operator)
        pending = wait_for("needs-hf Pending", in_phase(crd, served, "needs-hf", "Pending"), install.operator)
        assert condition(pending, "Stalled")["reason"] == "SecretNotFound"
        assert crd.get("rayjob", "needs-hf", served) is None  # refused before anything was created
        time.sleep(6)  # a resync later, the other namespace is still not served
        assert status(crd, other, "theirs") == {}
        log = install.operator.log_path.read_text()
        assert "forbidden" not in log.lower(), install.operator.log_tail()
    finally:
        install.stop()
        helm(crd, "uninstall", "scoped", "-n", system, "--wait")
        for ns in (system, served, other):
            crd.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_upgrade_keeps_jobs_and_uninstall_leaves_no_namespace_stuck(crd: Any, tmp_path: Path) -> None:
    system = _namespace(crd, "rljob-up", RESTRICTED)
    jobs = _namespace(crd, "upjobs")
    install = Install(crd, "up", system, tmp_path)
    try:
        crd.apply(_in(jobs, job("keeps")))
        before = wait_for("Running", in_phase(crd, jobs, "keeps", "Running"), install.operator)
        install.stop()
        helm(crd, "upgrade", "up", str(CHART), "-n", system, "--wait", "--set=operator.resyncSeconds=30")
        assert "--resync-seconds=30" in json.dumps(
            crd.get("deployment", "up-rljob", system)["spec"]["template"]["spec"]["containers"][0]["args"]
        )
        install.operator.start()  # the upgraded operator, same identity
        time.sleep(6)
        after = status(crd, jobs, "keeps")
        assert after["phase"] == "Running" and after["startTime"] == before["startTime"]
        assert crd.get("rayjob", "keeps", jobs)["metadata"]["uid"]  # the same job goes on
    finally:
        install.stop()
    helm(crd, "uninstall", "up", "-n", system, "--wait")
    assert (
        crd.get("clusterrole", "up-rljob") is None and crd.get("serviceaccount", "up-rljob", system) is None
    )
    assert (
        crd.get("clusterrole", "up-rljob-editor") is None
        and crd.get("role", "up-rljob-leader", system) is None
    )
    assert crd.get("crd", "rltrainingjobs.rljob.dev") is not None  # Helm never deletes CRDs
    crd.kubectl("delete", "namespace", system, jobs, "--wait=false")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        left = [ns for ns in (system, jobs) if crd.get("namespace", ns) is not None]
        if not left:
            return
        time.sleep(1)
    pytest.fail(f"namespaces still there 120 s after deletion, without the operator: {left}")
