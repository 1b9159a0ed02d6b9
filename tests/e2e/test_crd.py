"""The RLTrainingJob CRD on a real API server: it installs, reads well in kubectl, refuses every
bad manifest with a message naming the field (the same words as the Python models), fills the
same defaults as the models, and guards immutable fields."""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.kube_http import KubeHTTP

from rljob_api.errors import SpecError
from rljob_api.resource import API_VERSION, KIND, name_problems, parse_spec, size_problem

from spec_cases import BASE_SPEC, IMMUTABLE_CASES, MUTABLE_PATCHES, RULE_CASES, SCHEMA_CASES, Case, patched

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dry_namespace(crd: Any) -> Iterator[str]:
    """One namespace for the server-side dry runs, which store nothing: a namespace per case would
    cost the API server and the namespace controller more than the case itself."""
    ns = f"e2e-dry-{uuid.uuid4().hex[:8]}"
    crd.kubectl("create", "namespace", ns)
    yield ns
    crd.kubectl("delete", "namespace", ns, "--wait=false", check=False)


class DryRunApply:
    """``kubectl apply --server-side --dry-run=server`` as the one HTTP request it sends (a PATCH
    with ``application/apply-patch+yaml`` and ``dryRun=All``), for the case tables: a kubectl process
    per case cost about 0.4 s of two cores, the request about 20 ms. The API server's answer is the
    Status whose message kubectl prints; the tests that read kubectl's own output keep kubectl."""

    def __init__(self, kubeconfig: str) -> None:
        self.api = KubeHTTP(kubeconfig)

    def __call__(self, ns: str, obj: dict[str, Any]) -> tuple[bool, str]:
        """(accepted, the API server's message: empty when accepted)."""
        name = obj["metadata"]["name"]
        path = f"/apis/{API_VERSION}/namespaces/{ns}/rltrainingjobs/{name}?fieldManager=e2e&dryRun=All&force=true"
        status, data = self.api.request(
            "PATCH", path, body=json.dumps(obj).encode(), content_type="application/apply-patch+yaml"
        )
        if status < 300:
            return True, ""
        try:
            return False, str(json.loads(data).get("message", ""))
        except ValueError:
            return False, data.decode(errors="replace")


@pytest.fixture(scope="module")
def dry_apply(crd: Any) -> DryRunApply:
    return DryRunApply(str(crd.kubeconfig))


def _manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def _apply(cluster: Any, ns: str, obj: dict[str, Any], *, dry_run: bool = False) -> Any:
    args = ["apply", "--server-side", "--field-manager=e2e", f"--namespace={ns}", "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    return cluster.kubectl(*args, input=json.dumps(obj), check=False)


def _python_message(spec: dict[str, Any], path: str) -> str:
    """What the Python models say about `path` for this spec (the message after 'path: ')."""
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    for problem in info.value.problems:
        if problem.startswith(path + ": "):
            return problem[len(path) + 2 :]
    raise AssertionError(f"Python did not name {path}: {info.value.problems}")


def test_short_names_printer_columns_and_status(crd: Any, namespace: str) -> None:
    proc = _apply(crd, namespace, _manifest("columns", BASE_SPEC))
    assert proc.returncode == 0, proc.stderr
    # The runtime reports progress through the status subresource; the columns show it.
    progress = {
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Running",
                    "message": "step 120/3000",
                    "lastTransitionTime": "2026-11-28T00:00:00Z",
                }
            ],
            "gpus": 8,
            "progress": {"step": 120, "numRollout": 3000, "stepText": "120/3000", "rewardMean": 0.47},
        }
    }
    crd.kubectl(
        "patch",
        "rljob",
        "columns",
        f"--namespace={namespace}",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(progress),
    )
    for args in (["get", "rljobs"], ["get", "rljob", "columns"], ["get", "rltrainingjobs.rljob.dev"]):
        out = crd.kubectl(*args, f"--namespace={namespace}").stdout
        header, row = out.splitlines()[:2]
        assert header.split() == ["NAME", "PHASE", "REASON", "STEP", "REWARD", "GPUS", "AGE"], out
        assert row.split()[:6] == ["columns", "Running", "Running", "120/3000", "0.47", "8"], out
    wide = crd.kubectl("get", "rljobs", f"--namespace={namespace}", "-o", "wide").stdout
    assert "MODEL" in wide.splitlines()[0] and "Qwen/Qwen3-4B" in wide
    # The ml category lists it beside other ML workloads.
    assert (
        "rltrainingjob.rljob.dev/columns"
        in crd.kubectl("get", "ml", f"--namespace={namespace}", "-o", "name").stdout
    )


def test_explain_teaches_the_api(crd: Any) -> None:
    spec = crd.kubectl("explain", "rltrainingjob.spec").stdout
    assert "Desired state of an RL post-training run" in spec
    for field in (
        "model",
        "data",
        "algorithm",
        "rollout",
        "training",
        "resources",
        "reward",
        "checkpoint",
        "faultTolerance",
        "suspend",
        "queueName",
    ):
        assert re.search(rf"^\s+{field}\s", spec, re.M), f"explain does not list {field}:\n{spec}"
    rollout = crd.kubectl("explain", "rljob.spec.rollout.nSamplesPerPrompt").stdout
    assert "group size of GRPO" in rollout


def test_valid_manifest_gets_the_models_defaults(crd: Any, namespace: str) -> None:
    assert _apply(crd, namespace, _manifest("defaults", BASE_SPEC)).returncode == 0
    stored = crd.get("rljob", "defaults", namespace)["spec"]
    assert stored == parse_spec(BASE_SPEC).to_document()


def test_kubectl_prints_the_api_servers_refusal(crd: Any, dry_namespace: str, dry_apply: DryRunApply) -> None:
    """What the case tables below read over HTTP is what a user's kubectl prints."""
    case = RULE_CASES[0]
    doc = _manifest(f"bad-{case.name}", patched(case.patch))
    proc = _apply(crd, dry_namespace, doc, dry_run=True)
    accepted, message = dry_apply(dry_namespace, doc)
    assert proc.returncode != 0 and not accepted
    # kubectl names the object its own way ('The RLTrainingJob "x"' for 'RLTrainingJob.rljob.dev "x"')
    # and prints the API server's field errors as they are
    assert " is invalid: " in message, message
    assert message.split(" is invalid: ", 1)[1] in proc.stderr, (message, proc.stderr)
    ok = _manifest(f"ok-{case.name}", patched(case.valid_patch))
    assert _apply(crd, dry_namespace, ok, dry_run=True).returncode == 0 and dry_apply(dry_namespace, ok)[0]


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: c.name)
def test_rule_violations_are_refused_with_the_python_message(
    dry_apply: DryRunApply, dry_namespace: str, case: Case
) -> None:
    spec = patched(case.patch)
    accepted, message = dry_apply(dry_namespace, _manifest(f"bad-{case.name}", spec))
    assert not accepted, f"accepted: {case.name}"
    assert f"{case.path}: Invalid value" in message, message
    assert _python_message(spec, case.path) in message, message


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: c.name)
def test_nearby_valid_manifests_are_accepted(dry_apply: DryRunApply, dry_namespace: str, case: Case) -> None:
    accepted, message = dry_apply(dry_namespace, _manifest(f"ok-{case.name}", patched(case.valid_patch)))
    assert accepted, message


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=lambda c: c.name)
def test_schema_violations_are_refused_naming_the_field(
    dry_apply: DryRunApply, dry_namespace: str, case: Case
) -> None:
    accepted, message = dry_apply(dry_namespace, _manifest(f"bad-{case.name}", patched(case.patch)))
    assert not accepted, f"accepted: {case.name}"
    assert case.path in message, message


def test_immutable_fields_refuse_updates_and_mutable_ones_accept_them(crd: Any, namespace: str) -> None:
    assert _apply(crd, namespace, _manifest("immutable", BASE_SPEC)).returncode == 0
    for case in IMMUTABLE_CASES:
        proc = _apply(crd, namespace, _manifest("immutable", patched(case.patch)), dry_run=True)
        assert proc.returncode != 0, f"{case.name}: update accepted"
        assert case.path in proc.stderr and case.message in proc.stderr, proc.stderr
    for patch in MUTABLE_PATCHES:
        proc = _apply(crd, namespace, _manifest("immutable", patched(patch)), dry_run=True)
        assert proc.returncode == 0, f"{patch}: {proc.stderr}"


def test_a_bad_manifest_among_good_ones_is_refused_alone(crd: Any, namespace: str) -> None:
    good = _manifest("batch-good", BASE_SPEC)
    bad = _manifest("batch-bad", patched({"rollout": {"batchSize": 30}}))
    proc = crd.kubectl(
        "apply",
        "--server-side",
        f"--namespace={namespace}",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [good, copy.deepcopy(bad)]}),
        check=False,
    )
    assert proc.returncode != 0 and "batch-bad" in proc.stderr
    assert crd.get("rljob", "batch-bad", namespace) is None
    assert crd.get("rljob", "batch-good", namespace) is not None


@pytest.mark.parametrize("name", ["1st-run", "qwen.v2", "qwen-math-" + "x" * 38])
def test_names_kuberay_would_refuse_are_refused_with_the_python_message(
    crd: Any, dry_namespace: str, name: str
) -> None:
    proc = _apply(crd, dry_namespace, _manifest(name, BASE_SPEC), dry_run=True)
    assert proc.returncode != 0, f"accepted: {name}"
    assert "metadata.name" in proc.stderr, proc.stderr
    for problem in name_problems(name):
        assert problem in proc.stderr, proc.stderr


def test_a_job_over_the_request_limit_is_refused_as_validate_refuses_it(crd: Any, dry_namespace: str) -> None:
    env = [{"name": f"BIG_{i}", "value": "x" * 32768} for i in range(100)]
    doc = _manifest("too-large", patched({"resources": {"env": env[:64], "head": {"env": env[64:]}}}))
    assert size_problem(doc) is not None  # what `rljob-runtime validate` says
    proc = _apply(crd, dry_namespace, doc, dry_run=True)
    assert proc.returncode != 0, "accepted"
    assert "too large" in proc.stderr.lower(), proc.stderr
