"""The in-run trainer restart budget and its words (trainer_restart.py), and the colocated turns'
bookkeeping a restart relies on (colocation.Turns.make_room)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rljob_runtime.colocation import Turns
from rljob_runtime.trainer_restart import RestartsExhausted, TrainerRestarts, one_line


def test_restarts_are_counted_up_to_the_limit() -> None:
    budget = TrainerRestarts(limit=2)
    first = budget.admit(step=4, resume_step=4, lost_ranks=[1], cause="ActorDiedError")
    assert (first.number, budget.count) == (1, 1)
    assert budget.message(first, "/ckpt/iter_0000004") == (
        "trainer restart 1 of 2: trainer rank 1 lost at step 5 (ActorDiedError); going on from step 4 "
        "with checkpoint /ckpt/iter_0000004"
    )
    second = budget.admit(step=6, resume_step=4, lost_ranks=[2, 0], cause="node lost")
    assert budget.message(second, None).startswith(
        "trainer restart 2 of 2: trainer ranks 0, 2 lost at step 7"
    )
    assert budget.message(second, None).endswith("the initial weights (no checkpoint yet)")
    with pytest.raises(RestartsExhausted, match=r"trainer rank 3 lost at step 9 and all 2 restart\(s\)"):
        budget.admit(step=8, resume_step=4, lost_ranks=[3], cause="x")
    assert budget.count == 2


def test_no_restart_allowed_says_so() -> None:
    with pytest.raises(RestartsExhausted, match=r"faultTolerance\.maxTrainerRestarts is 0: boom"):
        TrainerRestarts(limit=0).admit(step=0, resume_step=0, lost_ranks=[0], cause="boom")


def test_one_line_drops_tracebacks_and_bounds_length() -> None:
    exc = RuntimeError("The actor died unexpectedly.\n  Traceback (most recent call last):\n  File x")
    assert one_line(exc) == "The actor died unexpectedly."
    assert len(one_line(RuntimeError("x" * 1000))) == 300
    assert one_line(RuntimeError()) == "RuntimeError"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append(name if not args else f"{name}{list(args[0])}")


def turns(colocate: bool) -> tuple[Turns, Recorder, Recorder]:
    spec = SimpleNamespace(resources=SimpleNamespace(colocate=colocate, device="cpu"))
    trainer, rollout = Recorder(), Recorder()
    return Turns(spec, trainer, rollout), trainer, rollout


def test_make_room_releases_engines_that_hold_the_gpu_only() -> None:
    t, _, rollout = turns(colocate=True)
    t.make_room()  # generating: the engines hold the GPU
    assert rollout.calls == ["release_memory"]
    t.make_room()  # released already: nothing more
    assert rollout.calls == ["release_memory"]
    t.to_engines(dict)
    assert rollout.calls[1:] == ["resume_memory['weights']", "resume_memory['kv_cache', 'cuda_graph']"]
    t.to_trainer()
    rollout.calls.clear()
    t.make_room()  # the trainer's turn: the engines released already
    assert rollout.calls == []


def test_a_restart_after_the_weights_came_back_does_not_resume_them_twice() -> None:
    t, _, rollout = turns(colocate=True)
    t.to_trainer()

    def dies() -> dict[str, float]:
        raise RuntimeError("trainer lost mid-push")

    with pytest.raises(RuntimeError):
        t.to_engines(dies)  # the weights came back, the push failed
    rollout.calls.clear()
    t.make_room()
    t.to_engines(dict)  # the restart's push
    assert rollout.calls == ["resume_memory['kv_cache', 'cuda_graph']"]


def test_disaggregated_turns_touch_no_engine_memory() -> None:
    t, _, rollout = turns(colocate=False)
    t.make_room()
    t.to_engines(dict)
    assert rollout.calls == []
