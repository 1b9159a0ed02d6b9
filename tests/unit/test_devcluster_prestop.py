"""The dev cluster's stand-in for the head pods' preStop hook (tools/devcluster/prestop.py): which
RayJob's driver gets SIGTERM, and how its process is found. The whole path (a suspended job saves
its step and resumes from it) is tests/e2e/test_job_restart.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "devcluster"))

import prestop


def test_only_a_suspended_rayjob_with_a_ray_job_is_stopped() -> None:
    assert prestop.to_stop({"spec": {"suspend": True}, "status": {"jobId": "rj-abc"}}) == "rj-abc"
    assert prestop.to_stop({"spec": {}, "status": {"jobId": "rj-abc"}}) is None  # running
    assert prestop.to_stop({"spec": {"suspend": True}, "status": {}}) is None  # queued: no Ray job yet
    assert prestop.to_stop({"spec": {"suspend": False}}) is None


def test_the_submission_id_comes_from_the_job_config_ray_gives_the_driver() -> None:
    config = {"runtime_env": {}, "metadata": {"job_submission_id": "rj-abc"}}
    assert prestop.submission_id({prestop.RAY_JOB_CONFIG_ENV: json.dumps(config)}) == "rj-abc"
    assert prestop.submission_id({}) is None
    assert prestop.submission_id({prestop.RAY_JOB_CONFIG_ENV: "not json"}) is None
    assert prestop.submission_id({prestop.RAY_JOB_CONFIG_ENV: '{"metadata": {}}'}) is None


def test_the_driver_of_a_ray_job_is_found_among_real_processes() -> None:
    """A stand-in driver with the command line and environment Ray's job supervisor gives one."""
    config = json.dumps({"metadata": {"job_submission_id": "rj-xyz"}})
    argv = [sys.executable, "-c", "import time; time.sleep(30)", "-m", "rljob_runtime.cli", "train"]
    child = subprocess.Popen(argv, env={**os.environ, prestop.RAY_JOB_CONFIG_ENV: config})
    other = subprocess.Popen(argv)  # a train process of no Ray job
    try:
        time.sleep(0.3)
        assert prestop.drivers("rj-xyz") == [child.pid]
        assert prestop.drivers("rj-other") == []
    finally:
        child.kill()
        other.kill()
        child.wait()
        other.wait()
