"""Passes take turns (reconcile.py): FOREGROUND_PASSES at a time, in the order asked for, so a burst
of new jobs is served job by job instead of all at once; passes for events of a job's RayJob and pods
take turns of their own (BACKGROUND_PASSES at a time), so the new jobs' first passes never wait
behind KubeRay's status writes on the jobs before them. What arrives meanwhile folds into one pass.
The prerequisites of a job are applied at once, and one refused still fails the pass."""

from __future__ import annotations

import asyncio
from typing import Any

from fake_kube import BINDING, JOB, RAYJOB, Harness, server_error

from rljob_operator.reconcile import BACKGROUND_PASSES, FOREGROUND_PASSES


def _started(h: Harness, *names: str) -> None:
    for name in names:
        h.kube.create_job(name)
    h.settle()
    assert all(h.kube.get(RAYJOB, "ml", name) is not None for name in names)


class Held:
    """Holds every pass where it reads its RayJob until released; counts how many are held at once."""

    def __init__(self, h: Harness) -> None:
        self.release = asyncio.Event()
        self.now = self.most = 0
        self.names: list[str] = []
        read_rayjob = h.reconciler._read_rayjob

        async def held(namespace: str, name: str) -> dict[str, Any] | None:
            self.now += 1
            self.most = max(self.most, self.now)
            self.names.append(name)
            await self.release.wait()
            self.now -= 1
            return await read_rayjob(namespace, name)

        h.reconciler._read_rayjob = held  # type: ignore[method-assign]


def test_child_event_passes_take_turns_and_a_job_event_does_not_wait_for_them() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    jobs = [f"job-{i}" for i in range(BACKGROUND_PASSES + 3)]
    _started(h, *jobs)
    h.kube.create_job(
        "job-new"
    )  # its event indexed, as kopf does before the handler; the test calls its pass
    h.kube.cached[("ml", "job-new")] = h.kube.get(JOB, "ml", "job-new") or {}
    passes = h.passes()
    held = Held(h)

    async def burst() -> None:
        loop = asyncio.get_running_loop()
        kuberay = [loop.create_task(h.reconciler.reconcile("ml", j, background=True)) for j in jobs]
        for _ in range(5):
            await asyncio.sleep(0)
        assert held.most == BACKGROUND_PASSES  # the rest wait for their turn
        new = loop.create_task(h.reconciler.reconcile("ml", "job-new"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert held.names[-1] == "job-new"  # started at once, beside the background passes
        # A second event of a waiting job folds into its waiting pass; a job event of it does not.
        more = [loop.create_task(h.reconciler.reconcile("ml", jobs[-1], background=True))]
        more.append(loop.create_task(h.reconciler.reconcile("ml", jobs[-1], "no-such-version")))
        held.release.set()
        await asyncio.gather(*kuberay, new, *more)

    h._run(burst)
    assert h.passes() - passes == len(jobs) + 2  # one per job, job-new's, and jobs[-1]'s job event


def test_the_prerequisites_are_applied_at_once() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a")
    in_flight: list[str] = []
    most: list[int] = [0]
    apply = h.kube.apply

    async def slow(obj: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        in_flight.append(obj["kind"])
        most[0] = max(most[0], len(in_flight))
        await asyncio.sleep(0)
        in_flight.remove(obj["kind"])
        return await apply(obj, **kwargs)

    h.kube.apply = slow  # type: ignore[method-assign]
    h.reconcile("job-a")
    # ServiceAccount, Role, NetworkPolicy together; then the RoleBinding (it needs its Role); then the RayJob
    assert most[0] == 3
    assert h.status("job-a")["phase"] == "Starting"


def test_one_refused_prerequisite_fails_the_pass_and_creates_no_rayjob() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    h.kube.create_job("job-a")
    h.kube.fail("apply", server_error(), when=lambda obj, **_: obj["kind"] == BINDING.rsplit("/", 1)[1])
    h.reconcile("job-a")
    assert h.reconciles("error") == 1 and h.kube.get(RAYJOB, "ml", "job-a") is None
    h.fire_retry()
    assert h.kube.get(RAYJOB, "ml", "job-a") is not None


def test_a_burst_of_new_jobs_is_served_in_turns_in_order() -> None:
    h = Harness()
    h.kube.add_node("gpu-0", gpus=8)
    jobs = [f"job-{i:02d}" for i in range(FOREGROUND_PASSES + 3)]
    for name in jobs:
        h.kube.create_job(name)
    held = Held(h)

    async def burst() -> None:
        loop = asyncio.get_running_loop()
        passes = [loop.create_task(h.reconciler.reconcile("ml", j)) for j in jobs]
        for _ in range(5):
            await asyncio.sleep(0)
        assert held.names == jobs[:FOREGROUND_PASSES]  # the first ones; the rest wait their turn
        held.release.set()
        await asyncio.gather(*passes)

    h._run(burst)
    assert held.names == jobs and held.most == FOREGROUND_PASSES
    assert all(h.kube.get(RAYJOB, "ml", name) is not None for name in jobs)
