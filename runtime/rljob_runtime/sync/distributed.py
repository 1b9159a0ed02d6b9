"""Disaggregated weight sync by NCCL broadcast (``/init_weights_update_group``,
``/update_weights_from_distributed`` with ``load_format: "flattened_bucket"``), SGLang's path for
engines on GPUs of their own (``nccl.py`` holds the group and the byte layout).

Trainer rank 0 hosts a group with every TP rank of every serving engine (rank 0 + rank offsets) and
broadcasts each bucket while each engine receives it in a request. The group is built at the first
push and again after an engine was relaunched (``membership_epoch``). A relaunched engine is
brought up to date alone: a group of the trainer and its ranks, one broadcast, left again.

An engine that dies mid-broadcast is noticed when its request fails (seconds), not at the group's
timeout: the trainer's side of the group is aborted so its broadcast returns, and every engine
still waiting in that broadcast is replaced (``engine_update``); the replacements get this version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import engine_api
from .base import (
    BroadcastSender,
    EngineUpdateLike,
    Metrics,
    RolloutSide,
    WeightSender,
    WeightTransport,
    timed,
)
from .buckets import DEFAULT_BUCKET_BYTES

ABORTED_WAIT_S = 120.0


class DistributedTransport(WeightTransport):
    name = "nccl"

    def __init__(
        self, cast: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES, backend: str = "nccl"
    ) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.cast, self.bucket_bytes, self.backend = cast, bucket_bytes, backend
        self._group: str | None = None  # the group every serving engine joined
        self._group_epoch = -1
        self._groups_made = 0
        self._specs: list[Any] | None = None

    def _new_group(self, trainer: BroadcastSender, rollout: RolloutSide, members: dict[str, int]) -> str:
        """Host a group on trainer rank 0 with these engines (URL -> TP ranks); its name."""
        self._groups_made += 1
        name = f"rljob-weights-{self._groups_made}"
        address, port = trainer.weight_group_address()
        world = 1 + sum(members.values())
        bodies, offset = {}, 1
        for url, ranks in members.items():
            bodies[url] = engine_api.init_weights_update_group_body(
                master_address=address,
                master_port=port,
                rank_offset=offset,
                world_size=world,
                group_name=name,
                backend=self.backend,
            )
            offset += ranks
        hosting = trainer.init_weight_update_group(address, port, world, name, self.backend)
        answers = rollout.call_engines("/init_weights_update_group", bodies)  # blocks until all joined
        failed = {u: a for u, a in answers.items() if isinstance(a, BaseException)}
        if failed:
            trainer.abort_weight_update_group()  # rank 0 may wait for members that will not come
            raise RuntimeError(f"engines could not join weight-update group {name!r}: {failed}")
        trainer.wait([hosting])
        return name

    def _leave(self, rollout: RolloutSide, name: str, urls: Sequence[str]) -> None:
        """Best effort: engines that died with the group are gone anyway."""
        rollout.call_engines(
            "/destroy_weights_update_group",
            {u: engine_api.destroy_weights_update_group_body(name) for u in urls},
        )

    def _ensure_group(self, trainer: BroadcastSender, rollout: RolloutSide) -> float:
        """The group of every serving engine (rebuilt if one was relaunched since); seconds spent."""
        if self._group is not None and self._group_epoch == rollout.membership_epoch:
            return 0.0
        metrics: Metrics = {}
        with timed(metrics, "t"):
            if self._group is not None:
                trainer.close_weight_update_group()
                self._leave(rollout, self._group, list(rollout.engine_tp_sizes()))
            epoch = rollout.membership_epoch
            self._group = self._new_group(trainer, rollout, rollout.engine_tp_sizes())
            self._group_epoch = epoch
        return metrics["t"]

    def _plan(self, trainer: BroadcastSender) -> list[Any]:
        if self._specs is None:  # names, shapes and dtypes do not change during a run
            self._specs = trainer.weight_bucket_specs(self.bucket_bytes, self.cast)
        return self._specs

    def _broadcast(self, trainer: BroadcastSender, update: EngineUpdateLike, group: str) -> float:
        """Bytes sent; 0 when a receiver died mid-way (the update replaces and refreshes it)."""
        specs = self._plan(trainer)
        aborted: list[bool] = []

        def on_lost() -> None:
            aborted.append(True)
            trainer.abort_weight_update_group()

        sending = trainer.broadcast_weights(specs)
        result: list[Any] = []  # stays empty when we aborted the broadcast
        try:
            update.post_each(
                "/update_weights_from_distributed",
                [spec.body(group) for spec in specs],
                collective=True,
                on_lost=on_lost,
            )
        finally:
            try:
                # an aborted broadcast returns at once; bounded, so a stuck one cannot hang the run
                result = trainer.wait(sending, timeout_s=ABORTED_WAIT_S) if aborted else trainer.wait(sending)
            except Exception:
                if not aborted:
                    raise
                # we aborted it: the trainer's broadcast raised as it should
        if aborted:
            self._group_epoch = -1  # the group lost members: build it anew at the next push
            return 0.0
        return float(result[0]["bytes"])

    def trainer_replaced(self, rollout: RolloutSide) -> None:
        """The group's host (the old trainer rank 0) is gone: the engines leave its group, and the
        next push builds one with the new rank 0."""
        if self._group is not None:
            self._leave(rollout, self._group, list(rollout.engine_tp_sizes()))
        self._group, self._group_epoch, self._specs = None, -1, None

    def push(self, trainer: WeightSender, rollout: RolloutSide, version: int | str | None = None) -> Metrics:
        metrics: Metrics = {"time/sync_group_init": self._ensure_group(trainer, rollout)}
        try:
            pushed = super().push(trainer, rollout, version)
        except BaseException:
            self._group_epoch = -1  # the group's state is unknown now: leave it and build anew next time
            raise
        return {**pushed, **metrics}

    def _transfer(self, trainer: BroadcastSender, rollout: RolloutSide, update: EngineUpdateLike) -> Metrics:
        assert self._group is not None
        metrics: Metrics = {}
        try:
            with timed(metrics, "time/sync_export"):  # the plan, once per run
                specs = self._plan(trainer)
            with timed(metrics, "time/sync_load"):  # pack + broadcast + the engines' loads
                size = self._broadcast(trainer, update, self._group)
        except BaseException:
            self._group_epoch = -1
            raise
        lost = float(len(getattr(update, "lost", {})))
        return {**metrics, "sync/bytes": size, "sync/buckets": float(len(specs)), "sync/engines_lost": lost}

    def refresh(self, trainer: BroadcastSender, rollout: RolloutSide, url: str) -> None:
        """A group of the trainer and this engine alone; the engines' shared group is rebuilt at the
        next push (the relaunch bumped ``membership_epoch``), since rank 0 hosts one group at a time."""
        with rollout.updating(only=url) as update:
            name = self._new_group(trainer, rollout, {url: update.tp_sizes[url]})
            self._group_epoch = -1
            try:
                self._broadcast(trainer, update, name)
            finally:
                trainer.close_weight_update_group()
                self._leave(rollout, name, [url])

    def close(self) -> None:
        self._group = None
