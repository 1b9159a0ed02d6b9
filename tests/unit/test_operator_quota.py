"""Quota admission: whole gangs, reserved GPUs of starting jobs, strict FIFO, clear messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rljob_operator.quota import Decision, JobDemand, Quota, decide

T0 = datetime(2026, 11, 22, tzinfo=UTC)
GPU = "nvidia.com/gpu"


def job(name: str, gpus: int, minutes: int, admitted: bool = False, charged: int = 0) -> JobDemand:
    return JobDemand(name, T0 + timedelta(minutes=minutes), gpus, admitted, charged)


def test_no_quota_admits_everything() -> None:
    assert decide("a", [job("a", 64, 0)], [], GPU) == Decision(True)


def test_whole_gang_must_fit() -> None:
    jobs = [job("a", 16, 0, admitted=True, charged=16), job("b", 16, 1)]
    verdict = decide("b", jobs, [Quota("gpus", 24, 16)], GPU)
    assert not verdict.admitted and verdict.reason == "InsufficientQuota"
    assert "needs 16 nvidia.com/gpu" in verdict.message and "allows 24, 16 in use" in verdict.message
    # After the first job is deleted its pods go and the quota frees up.
    assert decide("b", [job("b", 16, 1)], [Quota("gpus", 24, 0)], GPU).admitted


def test_admitted_jobs_without_pods_yet_reserve_their_gpus() -> None:
    # a was admitted a moment ago; its pods do not exist, so quota `used` does not show them yet.
    jobs = [job("a", 16, 0, admitted=True, charged=0), job("b", 16, 1)]
    verdict = decide("b", jobs, [Quota("gpus", 24, 0)], GPU)
    assert not verdict.admitted and "16 reserved by starting jobs" in verdict.message
    partly = [job("a", 16, 0, admitted=True, charged=8), job("b", 8, 1)]
    assert decide("b", partly, [Quota("gpus", 24, 8)], GPU).admitted  # 24 - 8 used - 8 reserved = 8


def test_fifo_a_blocked_big_job_holds_back_smaller_later_ones() -> None:
    jobs = [job("big", 24, 0), job("small", 4, 1)]
    quota = [Quota("gpus", 24, 8)]
    assert not decide("big", jobs, quota, GPU).admitted
    small = decide("small", jobs, quota, GPU)
    assert not small.admitted and small.position == 2 and "1 job(s) ahead" in small.message


def test_several_waiting_jobs_are_admitted_in_order_while_they_fit() -> None:
    jobs = [job("a", 8, 0), job("b", 8, 1), job("c", 8, 2)]
    quota = [Quota("gpus", 16, 0)]
    assert [decide(n, jobs, quota, GPU).admitted for n in "abc"] == [True, True, False]


def test_tightest_quota_wins_and_impossible_jobs_say_so() -> None:
    quotas = [Quota("team", 32, 0), Quota("project", 16, 12)]
    assert not decide("a", [job("a", 8, 0)], quotas, GPU).admitted
    too_big = decide("a", [job("a", 40, 0)], quotas, GPU)
    assert too_big.reason == "QuotaTooSmall" and "at most 16" in too_big.message


def test_cpu_jobs_and_admitted_jobs_pass() -> None:
    assert decide("a", [job("a", 0, 0)], [Quota("gpus", 0, 0)], GPU).admitted
    assert decide("a", [job("a", 8, 0, admitted=True)], [Quota("gpus", 0, 0)], GPU).admitted


def test_a_job_larger_than_the_hard_limit_is_refused_and_does_not_hold_up_the_queue() -> None:
    jobs = [job("huge", 32, 0), job("small", 8, 1)]
    quota = [Quota("team", 24, 0), Quota("project", 16, 0)]
    huge = decide("huge", jobs, quota, GPU)
    assert (huge.admitted, huge.reason, huge.impossible) == (False, "QuotaTooSmall", True)
    assert "ResourceQuota 'project' allows at most 16" in huge.message
    assert "does not hold up the jobs behind it" in huge.message
    assert decide("small", jobs, quota, GPU).admitted  # not behind `huge` in the FIFO
    assert not decide("small", jobs, quota, GPU).impossible


def test_the_counting_reads_quotas_pods_and_jobs_as_the_api_server_reports_them() -> None:
    from operator_fixtures import NOW, job_from_spec

    from rljob_operator.names import LABEL_COMPONENT, LABEL_JOB
    from rljob_operator.quota import charged_gpus, demands, quotas_of

    quotas = [
        {"metadata": {"name": "gpus"}, "status": {"hard": {"requests.nvidia.com/gpu": "16"}, "used": {}}},
        {"metadata": {"name": "cpu-only"}, "status": {"hard": {"requests.cpu": "64"}}},
        {"metadata": {"name": "new"}},  # the quota controller has not counted it yet
    ]
    assert quotas_of(quotas, GPU) == [Quota("gpus", 16, 0)]

    def pod(job: str, gpus: str, phase: str = "Running") -> dict[str, object]:
        resources = {"requests": {GPU: gpus}}
        return {
            "metadata": {"labels": {LABEL_JOB: job}},
            "spec": {"containers": [{"resources": resources}, {"resources": {}}]},
            "status": {"phase": phase},
        }

    pods = [pod("a", "8"), pod("a", "8"), pod("b", "4"), pod("b", "4", phase="Succeeded")]
    assert charged_gpus(pods, GPU) == {"a": 16, "b": 4}

    def rayjob(job: str, component: str = "rayjob", suspend: bool = False) -> dict[str, object]:
        labels = {LABEL_JOB: job, LABEL_COMPONENT: component}
        return {"metadata": {"labels": labels}, "spec": {"suspend": suspend}}

    running = job_from_spec(name="a")
    converting = job_from_spec(name="b")  # only its conversion RayJob exists: not admitted
    done = job_from_spec(name="c", status={"phase": "Succeeded"})
    kueue = job_from_spec({"queueName": "team"}, name="d")
    me = job_from_spec(name="e")
    rayjobs = [rayjob("a"), rayjob("b", component="conversion"), rayjob("c")]
    got = demands(me, [running, converting, done, kueue], rayjobs, {"a": 16}, NOW)
    assert [(d.name, d.admitted, d.charged_gpus) for d in got] == [
        ("a", True, 16),
        ("b", False, 0),
        ("e", False, 0),
    ]
