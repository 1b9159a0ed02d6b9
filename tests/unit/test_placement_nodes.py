"""Which weight transport a run may use follows where Ray placed the trainer and the engines
(``Placement.on_one_node``), whatever other nodes the cluster has (the Ray head, say)."""

from __future__ import annotations

from rljob_runtime.placement import Placement, Slot


def _placement(nodes: tuple[str, ...], colocated: bool = True) -> Placement:
    slots = [Slot(None, i) for i in range(len(nodes))]
    if colocated:
        return Placement(slots, slots, True, 1, nodes)
    return Placement(slots[:1], slots[1:], False, 1, nodes)


def test_trainer_and_engines_on_one_worker_are_on_one_node() -> None:
    assert _placement(("worker", "worker")).on_one_node()
    assert _placement(("worker", "worker"), colocated=False).on_one_node()


def test_bundles_on_two_nodes_are_not() -> None:
    assert not _placement(("worker-a", "worker-b")).on_one_node()
    assert not _placement(("trainer-pod", "rollout-pod"), colocated=False).on_one_node()


def test_unknown_nodes_are_not_taken_for_one() -> None:
    assert not _placement(()).on_one_node()
    assert not _placement(("", "")).on_one_node()
    assert _placement(("worker",)).on_one_node()
