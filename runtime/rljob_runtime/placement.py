"""Ray placement groups for the trainer and the rollout engines.

One bundle per GPU ({"GPU": 1, "CPU": 1, <group resource>: 1}); on device cpu a bundle is one CPU
process slot ({"CPU": 1, <group resource>: 1}), so the same code places the same actors. The group
resource is the custom Ray resource the operator advertises on each worker group (see
rljob_api.contract), so bundles land on the right pods: colocated jobs use `rljob_colocated` for both
trainer and engines (they share the bundles), disaggregated jobs `rljob_trainer` and
`rljob_rollout`. How many GPUs a node has is whatever Ray reports; nobody types it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rljob_api.contract import RAY_RESOURCE_COLOCATED, RAY_RESOURCE_ROLLOUT, RAY_RESOURCE_TRAINER
from rljob_api.spec import RLTrainingJobSpec, trainer_gpus
from rljob_api.spec_resources import rollout_gpus


class PlacementError(RuntimeError):
    """The cluster cannot host the job's bundles."""


@dataclass(frozen=True)
class Slot:
    """One bundle of a placement group: where one trainer rank or one engine GPU goes."""

    group: Any  # ray.util.placement_group.PlacementGroup
    index: int
    # The job's bundles on this bundle's node (this one included): the processes that share its
    # cores (on device cpu, cpu_threads gives each its part of them).
    share: int = 1

    def options(self, fraction: float = 1.0) -> dict[str, Any]:
        """Ray actor options that pin an actor to this bundle (`fraction` of its resources)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=self.index
            ),
            "num_cpus": fraction,
        }


@dataclass(frozen=True)
class Placement:
    trainer: list[Slot]
    rollout: list[Slot]  # one slot per rollout GPU; engine i uses rollout[i*k:(i+1)*k]
    colocated: bool
    gpus_per_engine: int
    # The Ray node of each bundle, by bundle index (as placed; empty where Ray did not say).
    bundle_nodes: tuple[str, ...] = ()

    def on_one_node(self) -> bool:
        """Every trainer rank and engine sits on one Ray node (then weights may go through a file on
        it). The Ray head may be another node: the driver only posts the file's path."""
        known = self.bundle_nodes
        nodes = {known[s.index] if s.index < len(known) else "" for s in [*self.trainer, *self.rollout]}
        return len(nodes) == 1 and "" not in nodes

    def release(self) -> None:
        """Give the bundles back to Ray. A driver's placement groups outlive its run on a Ray that
        outlives the driver's job (a second run in the same process, a long-lived cluster): the next
        run could not place its own."""
        import ray

        slots = [*self.trainer, *self.rollout]
        if slots and ray.is_initialized():
            ray.util.remove_placement_group(slots[0].group)

    def engine_slots(self) -> list[list[Slot]]:
        k = self.gpus_per_engine
        return [self.rollout[i : i + k] for i in range(0, len(self.rollout), k)]


def bundle_shapes(spec: RLTrainingJobSpec) -> list[dict[str, float]]:
    """The bundles of the job's one placement group: trainer bundles first, then rollout's."""
    res = spec.resources
    gpu = {"GPU": 1.0} if res.device == "cuda" else {}
    if res.colocate:
        return [{**gpu, "CPU": 1.0, RAY_RESOURCE_COLOCATED: 1.0} for _ in range(trainer_gpus(spec))]
    trainer = [{**gpu, "CPU": 1.0, RAY_RESOURCE_TRAINER: 1.0} for _ in range(trainer_gpus(spec))]
    rollout = [{**gpu, "CPU": 1.0, RAY_RESOURCE_ROLLOUT: 1.0} for _ in range(rollout_gpus(res))]
    return trainer + rollout


def local_resources(spec: RLTrainingJobSpec) -> dict[str, float]:
    """Custom resources a local Ray (no operator, e.g. a laptop or CI) must declare to host the job."""
    totals: dict[str, float] = {}
    for bundle in bundle_shapes(spec):
        for name, amount in bundle.items():
            if name not in ("CPU", "GPU"):
                totals[name] = totals.get(name, 0.0) + amount
    return totals


def create_placement(spec: RLTrainingJobSpec, timeout_s: float = 300.0) -> Placement:
    """Reserve the job's bundles (PACK: as few nodes as possible) and wait until they are placed."""
    import ray
    from ray.util.placement_group import placement_group

    shapes = bundle_shapes(spec)
    group = placement_group(shapes, strategy="PACK", name=f"rljob-{id(spec):x}")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        available = ray.available_resources()
        needed = local_resources(spec)
        have = {name: available.get(name, 0.0) for name in needed}
        ray.util.remove_placement_group(group)
        raise PlacementError(
            f"could not place {len(shapes)} bundles in {timeout_s:.0f} s: the job needs {needed}, the Ray "
            f"cluster has {have} free (CPU free: {available.get('CPU', 0.0)})"
        )
    trainer_n = trainer_gpus(spec)
    nodes = _bundle_nodes(group)
    slots = [Slot(group, i, share) for i, share in enumerate(node_shares(nodes, len(shapes)))]
    res = spec.resources
    if res.colocate:
        trainer, rollout = slots, slots[: rollout_gpus(res)]
    else:
        trainer, rollout = slots[:trainer_n], slots[trainer_n:]
    return Placement(trainer, rollout, res.colocate, res.rollout.gpus_per_engine, nodes)


def node_shares(bundle_nodes: Sequence[str], bundles: int) -> list[int]:
    """For each bundle, how many of the job's bundles sit on its node. A bundle whose node Ray did
    not name is taken to share it with every bundle (the cautious guess: fewer threads)."""
    counts = Counter(bundle_nodes)
    return [
        counts[bundle_nodes[i]] if i < len(bundle_nodes) and bundle_nodes[i] else bundles
        for i in range(bundles)
    ]


def _bundle_nodes(group: Any) -> tuple[str, ...]:
    """The node id of each bundle of a placed group, from Ray's placement group table."""
    from ray.util import placement_group_table

    by_index = placement_group_table(group).get("bundles_to_node_id") or {}
    return tuple(str(by_index.get(i, "")) for i in range(len(by_index)))
