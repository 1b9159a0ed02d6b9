"""A job pod that cannot create its container (a missing Secret) makes the Starting job Stalled
with the kubelet's message, until the pod starts."""

from __future__ import annotations

from fake_kube import Harness

MISSING = {"reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}


def test_a_pod_stuck_on_a_missing_secret_stalls_the_starting_job() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a")
    h.reconcile("job-a")
    h.kube.add_pod("job-b", "job-b-gpu-0", gpus=8, waiting=MISSING)  # another job's pod
    h.kube.add_pod("job-a", "job-a-head", phase="Running")
    h.reconcile("job-a")
    assert h.condition("job-a", "Stalled")["status"] == "False"
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, waiting=MISSING)
    h.reconcile("job-a")
    stalled = h.condition("job-a", "Stalled")
    assert (h.status("job-a")["phase"], stalled["status"], stalled["reason"]) == (
        "Starting",
        "True",
        "CreateContainerConfigError",
    )
    assert (
        "pod job-a-gpu-0 cannot start container 'ray-worker': secret \"hf\" not found" in stalled["message"]
    )
    assert h.events[-1][:2] == ("Warning", "CreateContainerConfigError")
    h.kube.add_pod("job-a", "job-a-gpu-0", gpus=8, phase="Running")  # the Secret was created
    h.reconcile("job-a")
    assert h.condition("job-a", "Stalled")["status"] == "False"
    assert h.condition("job-a", "Reconciling")["status"] == "True"
