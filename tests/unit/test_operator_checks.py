"""Pre-flight checks: a job that cannot run is stopped before anything is created, with a message
that names the problem and what to do."""

from __future__ import annotations

from operator_fixtures import job_from_example, job_from_spec

from rljob_operator.checks import NodeInfo, check_name, check_nodes, check_references

H100 = [NodeInfo(f"h100-{i}", {"rljob.dev/gpu-pool": "h100"}, {"nvidia.com/gpu": "8"}) for i in range(4)]
L4 = [NodeInfo(f"l4-{i}", {"rljob.dev/gpu-pool": "l4"}, {"nvidia.com/gpu": "4"}) for i in range(2)]
CPU = [NodeInfo("cpu-0", {}, {"cpu": "32"})]


def test_name_longer_than_kuberay_allows_is_terminal() -> None:
    blocker = check_name(job_from_spec(name="x" * 48))
    assert blocker is not None and blocker.terminal and "47" in blocker.message
    assert check_name(job_from_spec(name="x" * 47)) is None


def test_gpus_per_pod_must_fit_some_allowed_node() -> None:
    assert check_nodes(job_from_example("grpo-disaggregated.yaml"), H100 + L4 + CPU) is None
    too_many = job_from_spec(
        {"resources": {"trainer": {"gpusPerNode": 16, "nodes": 1}}, "training": {"globalBatchSize": 256}}
    )
    blocker = check_nodes(too_many, H100 + L4)
    assert blocker is not None and blocker.reason == "NoNodeFits" and "offers 8" in blocker.message
    wrong_pool = job_from_spec({"resources": {"nodeSelector": {"rljob.dev/gpu-pool": "l4"}}})
    blocker = check_nodes(wrong_pool, H100 + L4)
    assert blocker is not None and "needs 8 nvidia.com/gpu per pod on nodes matching" in blocker.message
    assert check_nodes(job_from_example("grpo-cpu-demo.yaml"), CPU) is None  # no GPUs needed


def test_missing_secret_and_claim_are_named() -> None:
    job = job_from_example("grpo-job.yaml")  # HF token secret hf-token, claim rl-shared
    blocker = check_references(job, secrets=set(), claims={"rl-shared"})
    assert blocker is not None and blocker.reason == "SecretNotFound" and "'hf-token'" in blocker.message
    blocker = check_references(job, secrets={"hf-token"}, claims=set())
    assert blocker is not None and blocker.reason == "VolumeNotFound" and "'rl-shared'" in blocker.message
    assert check_references(job, secrets={"hf-token"}, claims={"rl-shared"}) is None
    optional = job_from_spec(
        {
            "resources": {
                "env": [
                    {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}}}
                ]
            }
        }
    )
    assert check_references(optional, secrets=set(), claims=set()) is None


def test_secrets_are_not_checked_without_the_preflight_grant() -> None:
    job = job_from_example("grpo-job.yaml")
    assert check_references(job, secrets=None, claims={"rl-shared"}) is None
