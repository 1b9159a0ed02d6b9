"""Placement groups on a local Ray: colocated jobs put trainer ranks and engines on the same
bundles of the `rljob_colocated` resource; disaggregated jobs use separate `rljob_trainer` and
`rljob_rollout` bundles. On CPU the custom resource stands in for GPUs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from rljob_api.resource import parse_spec
from rljob_runtime.placement import PlacementError, bundle_shapes, create_placement, local_resources

BASE = {
    "model": {"path": "m"},
    "data": {"path": "d.jsonl"},
    "rollout": {"engine": "hf", "batchSize": 4, "nSamplesPerPrompt": 2},
    "training": {"backend": "torch", "globalBatchSize": 8, "microBatchSize": 1},
}


def spec(**resources: object):  # type: ignore[no-untyped-def]
    return parse_spec(
        {**BASE, "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}, **resources}}
    )


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(
        num_cpus=6,
        resources={"rljob_colocated": 2, "rljob_trainer": 2, "rljob_rollout": 2},
        include_dashboard=False,
    )
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class Where:
    def bundle(self) -> tuple[str, list[str]]:
        ctx = ray.get_runtime_context()
        return ctx.get_placement_group_id(), sorted(ctx.get_assigned_resources())


def _placed(slot, fraction: float) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    actor = Where.options(**slot.options(fraction)).remote()
    try:
        return ray.get(actor.bundle.remote())
    finally:
        ray.kill(actor)


def test_colocated_trainer_and_engines_share_bundles() -> None:
    s = spec()
    assert local_resources(s) == {"rljob_colocated": 2.0}
    placement = create_placement(s)
    try:
        assert [x.index for x in placement.trainer] == [0, 1]
        assert [x.index for x in placement.rollout] == [0, 1]  # the same bundles
        assert len(placement.engine_slots()) == 2
        # Ray's table names each bundle's node: the one node of this local Ray
        assert placement.bundle_nodes == (ray.get_runtime_context().get_node_id(),) * 2
        assert placement.on_one_node()
        group, resources = _placed(placement.trainer[0], 0.5)
        assert (
            group == placement.trainer[0].group.id.hex()
            and any("rljob_colocated" in r for r in resources) is False
        )
        assert _placed(placement.rollout[0], 0.2)[0] == group
    finally:
        ray.util.remove_placement_group(placement.trainer[0].group)


def test_disaggregated_bundles_use_their_own_resources() -> None:
    s = spec(colocate=False, rollout={"gpus": 2, "gpusPerNode": 2, "gpusPerEngine": 2})
    shapes = bundle_shapes(s)
    assert [sorted(b) for b in shapes] == [["CPU", "rljob_trainer"]] * 2 + [["CPU", "rljob_rollout"]] * 2
    placement = create_placement(s)
    try:
        assert [x.index for x in placement.trainer] == [0, 1]
        assert [x.index for x in placement.rollout] == [2, 3]
        assert [[x.index for x in e] for e in placement.engine_slots()] == [[2, 3]]
        table = ray.util.placement_group_table(placement.trainer[0].group)
        assert table["bundles"][0]["rljob_trainer"] == 1.0 and table["bundles"][2]["rljob_rollout"] == 1.0
    finally:
        ray.util.remove_placement_group(placement.trainer[0].group)


def test_a_cluster_without_the_resources_is_refused_clearly() -> None:
    too_big = spec(trainer={"nodes": 1, "gpusPerNode": 8})
    with pytest.raises(PlacementError, match="rljob_colocated"):
        create_placement(too_big, timeout_s=3)
