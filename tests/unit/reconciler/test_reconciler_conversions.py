"""Conversion jobs run by the operator: the Megatron checkpoint made before training (megatron backend
with a model cache), the final export after it (checkpoint.export.huggingFace) and the exports of
saved iterations on demand (checkpoint.export.steps), each a RayJob of its own, kept in
status.conversions; a failed one stalls the job until its RayJob is deleted."""

from __future__ import annotations

import yaml
from fake_kube import RAYJOB, Harness

from rljob_api.contract import JOB_ENV, MEGATRON_CACHE_ENV
from rljob_operator.conversions import child_name
from rljob_operator.names import RAYJOB_NAME_MAX

CLAIMS = ("cache", "ckpt")
MEGATRON = {"resources": {"modelCache": {"claimName": "cache"}}}
EXPORT = {
    "training": {"backend": "torch", "numRollout": 10},
    "checkpoint": {"path": "/ckpt/run", "volume": {"claimName": "ckpt"}, "export": {"huggingFace": True}},
}
FAILED = (
    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    "conversion failed: model.layers.0.mlp.up_proj.weight: shape (64, 32) != (64, 48)\n"
)


def _harness(spec: dict) -> Harness:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    for claim in CLAIMS:
        h.kube.put("v1/PersistentVolumeClaim", "ml", claim, {"spec": {}})
    h.kube.create_job("job-a", spec)
    return h


def _rayjob(h: Harness, name: str) -> dict | None:
    return h.kube.get(RAYJOB, "ml", name)


def _succeed(h: Harness, name: str) -> None:
    h.kube.set_rayjob_status(name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")


def _ready(h: Harness) -> tuple[str, str, str]:
    ready = h.condition("job-a", "Ready")
    return h.status("job-a")["phase"], ready["reason"], ready["message"]


def test_the_megatron_checkpoint_is_made_before_training_then_never_again() -> None:
    h = _harness(MEGATRON)
    h.reconcile("job-a")
    conversion = _rayjob(h, "job-a-convert")
    assert conversion is not None and _rayjob(h, "job-a") is None  # training waits for it
    assert conversion["spec"]["entrypoint"] == (
        "rljob-runtime convert megatron-cache --model Qwen/Qwen3-4B --tp 1 --pp 1"
    )
    assert conversion["spec"]["rayClusterSpec"]["workerGroupSpecs"] == []  # one pod, no GPUs
    head = conversion["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert "/var/cache/rljob" in mounts  # the model cache it writes to
    assert conversion["metadata"]["labels"]["app.kubernetes.io/component"] == "conversion"
    phase, reason, message = _ready(h)
    assert (phase, reason) == ("Converting", "ConvertingCheckpoint")
    assert "RayJob job-a-convert" in message and "training starts when it is done" in message
    status = h.status("job-a")
    assert status["children"]["conversionJobs"] == ["job-a-convert"]
    assert status["conversions"] == [
        {
            "rayJob": "job-a-convert",
            "kind": "MegatronCheckpoint",
            "path": "/var/cache/rljob/rljob/megatron",
            "state": "Running",
            "message": "",
        }
    ]
    assert ("Normal", "ConversionStarted") in [e[:2] for e in h.events]
    assert h.condition("job-a", "Reconciling")["status"] == "True"
    h.reconcile("job-a")  # still running: nothing new
    assert _rayjob(h, "job-a") is None

    _succeed(h, "job-a-convert")
    h.reconcile("job-a")
    training = _rayjob(h, "job-a")
    assert training is not None
    env = yaml.safe_load(training["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env[MEGATRON_CACHE_ENV] == "1" and JOB_ENV in env
    assert h.status("job-a")["conversions"][0]["state"] == "Succeeded"
    assert h.status("job-a")["phase"] == "Starting"
    assert ("Normal", "ConversionSucceeded") in [e[:2] for e in h.events]

    # A succeeded conversion is never looked up or run again, even once its RayJob is gone.
    h.kube.delete(RAYJOB, "ml", "job-a-convert")
    before = len(h.kube.calls)
    h.reconcile("job-a")
    looked_up = [c.args[1] for c in h.kube.calls[before:] if c.method == "get_rayjob"]
    assert looked_up == ["job-a"] and _rayjob(h, "job-a-convert") is None
    assert h.status("job-a")["conversions"][0]["state"] == "Succeeded"


def test_a_failed_conversion_stalls_the_job_until_its_rayjob_is_deleted() -> None:
    h = _harness(MEGATRON)
    h.reconcile("job-a")
    h.kube.set_rayjob_status(
        "job-a-convert", jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed", message=FAILED
    )
    h.reconcile("job-a")
    phase, reason, message = _ready(h)
    assert (phase, reason) == ("Converting", "ConversionFailed")
    assert "model.layers.0.mlp.up_proj.weight: shape (64, 32) != (64, 48)" in message
    assert "delete RayJob job-a-convert to run it again" in message
    assert h.condition("job-a", "Stalled")["status"] == "True"
    assert h.status("job-a")["conversions"][0]["message"].startswith("conversion failed: model.layers.0")
    warning = next(e for e in h.events if e[1] == "ConversionFailed")
    assert warning[0] == "Warning"
    for _ in range(2):  # kept for a person to read: not re-created, training not started
        h.reconcile("job-a")
    assert _rayjob(h, "job-a") is None and _rayjob(h, "job-a-convert")["status"]["jobStatus"] == "FAILED"

    h.kube.delete(RAYJOB, "ml", "job-a-convert")  # the person's "try again"
    h.reconcile("job-a")
    again = _rayjob(h, "job-a-convert")
    assert again is not None and not again.get("status")
    assert _ready(h)[:2] == ("Converting", "ConvertingCheckpoint")
    assert h.status("job-a")["conversions"][0]["state"] == "Running"


def test_no_conversion_without_a_model_cache_or_with_a_checkpoint_of_ones_own() -> None:
    for spec in ({}, {**MEGATRON, "model": {"megatronCheckpoint": "/ckpt/dist"}}):
        h = _harness(spec)
        h.reconcile("job-a")
        training = _rayjob(h, "job-a")
        assert training is not None and _rayjob(h, "job-a-convert") is None
        assert MEGATRON_CACHE_ENV not in yaml.safe_load(training["spec"]["runtimeEnvYAML"])["env_vars"]
        assert "conversions" not in h.status("job-a")


def test_the_final_export_runs_after_training_and_the_job_succeeds_when_it_is_written() -> None:
    h = _harness(EXPORT)
    h.reconcile("job-a")
    assert _rayjob(h, "job-a-export-10") is None  # nothing to export before training ends
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.reconcile("job-a")
    _succeed(h, "job-a")
    h.reconcile("job-a")
    export = _rayjob(h, "job-a-export-10")
    assert export is not None
    assert export["spec"]["entrypoint"] == (
        "rljob-runtime convert export --checkpoints /ckpt/run --step 10 --out /ckpt/run/hf/iter_0000010 "
        "--model Qwen/Qwen3-4B"
    )
    phase, reason, message = _ready(h)
    assert (phase, reason) == ("Converting", "Exporting")
    assert "exporting it to /ckpt/run/hf/iter_0000010 (RayJob job-a-export-10)" in message
    assert h.condition("job-a", "Succeeded")["status"] == "False"

    # KubeRay's ttlSecondsAfterFinished removes the training RayJob meanwhile: it is not re-created.
    h.kube.delete(RAYJOB, "ml", "job-a")
    h.reconcile("job-a")
    assert _rayjob(h, "job-a") is None and _ready(h)[:2] == ("Converting", "Exporting")

    _succeed(h, "job-a-export-10")
    h.reconcile("job-a")
    phase, reason, message = _ready(h)
    assert (phase, reason) == ("Succeeded", "Completed")
    assert message.endswith("; exported to /ckpt/run/hf/iter_0000010")
    assert h.condition("job-a", "Succeeded")["status"] == "True"
    assert h.status("job-a")["conversions"] == [
        {
            "rayJob": "job-a-export-10",
            "kind": "Export",
            "path": "/ckpt/run/hf/iter_0000010",
            "state": "Succeeded",
            "step": 10,
            "message": "",
        }
    ]
    h.reconcile("job-a")
    assert _rayjob(h, "job-a") is None  # finished: nothing is created again


def test_a_failed_export_stalls_the_finished_job_and_runs_again_when_deleted() -> None:
    h = _harness(EXPORT)
    h.reconcile("job-a")
    _succeed(h, "job-a")
    h.reconcile("job-a")
    h.kube.set_rayjob_status(
        "job-a-export-10",
        jobDeploymentStatus="Failed",
        jobStatus="FAILED",
        message="Job entrypoint command failed with exit code 1, last available logs:\nexport failed: disk full",
    )
    h.reconcile("job-a")
    phase, reason, message = _ready(h)
    assert (phase, reason) == ("Converting", "ExportFailed")
    assert "export failed: disk full" in message and h.condition("job-a", "Stalled")["status"] == "True"
    h.kube.delete(RAYJOB, "ml", "job-a-export-10")
    h.reconcile("job-a")
    assert _rayjob(h, "job-a-export-10") is not None and _ready(h)[:2] == ("Converting", "Exporting")
    assert _rayjob(h, "job-a") is not None  # the finished training RayJob is left as it is
    _succeed(h, "job-a-export-10")
    h.reconcile("job-a")
    assert _ready(h)[:2] == ("Succeeded", "Completed")


def test_exports_on_demand_run_once_their_iteration_is_saved_without_holding_quota() -> None:
    spec = {**EXPORT, "checkpoint": {**EXPORT["checkpoint"], "export": {"steps": [4, 8]}}}
    h = _harness(spec)
    h.kube.set_quota(hard=8)
    h.reconcile("job-a")
    h.kube.set_rayjob_status("job-a", jobDeploymentStatus="Running", jobStatus="RUNNING")
    h.kube.report_progress("job-a", {"step": 5, "lastCheckpointStep": 4})
    h.reconcile("job-a")
    assert _rayjob(h, "job-a-export-4") is not None and _rayjob(h, "job-a-export-8") is None
    assert h.status("job-a")["phase"] == "Running"  # exports on demand do not change the phase
    _succeed(h, "job-a-export-4")
    h.reconcile("job-a")
    assert h.status("job-a")["conversions"][0]["state"] == "Succeeded"
    # A second job is admitted against the quota as if no conversion RayJob existed.
    h.kube.create_job("job-b", {"resources": {"trainer": {"gpusPerNode": 8}}})
    h.reconcile("job-b")
    assert h.status("job-b")["phase"] == "Queued"
    _succeed(h, "job-a")
    h.reconcile("job-a")  # finished: every listed step is exported (no huggingFace: no final export)
    assert _rayjob(h, "job-a-export-8") is not None
    assert h.status("job-a")["phase"] == "Succeeded"


def test_conversion_rayjob_names_fit_kuberays_limit() -> None:
    assert child_name("job-a", "convert") == "job-a-convert"
    long = "x" * RAYJOB_NAME_MAX
    names = {child_name(long, "export-1234567"), child_name(long[:-1] + "y", "export-1234567")}
    assert len(names) == 2 and all(len(n) <= RAYJOB_NAME_MAX and n.endswith("-export-1234567") for n in names)


def test_a_conversion_pod_that_cannot_start_says_why() -> None:
    h = _harness(MEGATRON)
    h.reconcile("job-a")
    unbound = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    h.kube.add_pod("job-a", "job-a-convert-head", role="head", unschedulable=unbound)
    h.reconcile("job-a")
    phase, reason, message = _ready(h)
    assert (phase, reason) == ("Converting", "Unschedulable")
    assert "unbound immediate PersistentVolumeClaims" in message
