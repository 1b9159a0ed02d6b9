"""TrainerGroup: a backend's ranks as Ray actors, one per trainer slot, seen as one trainer.

The driver hands over a whole rollout (plain Samples and CPU tensors); the group shards it, every
global batch (one optimizer step) split into contiguous shares, one per data-parallel rank
(``rank_rows``), and reassembles per-token results in the samples' order. With the megatron backend
the ranks of one model replica (its TP x PP peers, same data-parallel rank) all get that replica's
rows (``replica_rows``) and the results are read from one of them (``replica_leaders``). Exporting
the weights is a collective of the ranks whose layout says ``exports_weights`` (``exporting_ranks``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rljob_api.spec import RLTrainingJobSpec

from .base import (
    LogProbs,
    Metrics,
    TrainBatch,
    TrainerRank,
    build_batch,
    check_per_token,
    loss_denominator,
    pad_columns,
    replica_leaders,
    replica_rows,
)
from .torch_backend import TorchTrainerRank, actor_env

if TYPE_CHECKING:
    from ..data.sample import Sample
    from ..placement import Slot


def _gather(refs: list[Any], timeout_s: float | None = None) -> list[Any]:
    """ray.get of every ref, raising the first failure as soon as it happens (a rank that fails
    while the others wait in a collective must not leave the caller blocked on them)."""
    import ray

    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not ready:
            raise TimeoutError(f"{len(pending)} trainer rank call(s) did not finish in {timeout_s} s")
        ray.get(ready)
    return ray.get(refs)


CONTROL_GROUP = "control"


def exporting_ranks(layouts: Sequence[Mapping[str, int]]) -> list[bool]:
    """Per rank, whether it takes part in the weights' export (a collective): its layout's
    ``exports_weights``, or data-parallel rank 0 for a layout without it. Global rank 0 must be one
    of them: it is the one rank that sends (``weight_source.WeightSource``)."""
    exports = [bool(lay.get("exports_weights", int(lay["dp_rank"]) == 0)) for lay in layouts]
    if exports and not exports[0]:
        raise ValueError(f"global rank 0 does not export the weights (layouts: {list(layouts)})")
    return exports


def rank_class(backend: str) -> type[TrainerRank]:
    """The rank class of a trainer backend (megatron's imports megatron-core only on its actors); the
    return type has the type checker hold both classes to ``TrainerRank``."""
    if backend == "torch":
        return TorchTrainerRank
    if backend == "megatron":
        from .megatron.backend import MegatronTrainerRank

        return MegatronTrainerRank
    raise ValueError(f"unknown training.backend {backend!r}")


class TrainerGroup:
    """A trainer backend's ranks seen as one trainer (implements ``base.TrainerBackend``).

    Two threads use it: the driver's, and the rollout manager's when it relaunches an engine and asks
    ``named_tensors`` for the current weights. An operation's calls to its ranks are submitted under
    one lock, so every rank queues the operations in the same order (Ray runs one submitter's actor
    calls in submission order); interleaved, two collectives could each wait on the other's ranks.
    """

    def __init__(self, spec: RLTrainingJobSpec, actors: list[Any], dp_ranks: list[int] | None = None) -> None:
        self.spec = spec
        self.actors = actors  # Ray actor handles, rank order
        # Data-parallel rank of each actor: the torch backend is data parallel only (rank = dp rank).
        self.dp_ranks = list(range(len(actors))) if dp_ranks is None else dp_ranks
        self.exports: list[bool] | None = None  # per actor, from its layout (None: dp rank 0's ranks)
        self._submitting = threading.Lock()

    def use_layouts(self, layouts: Sequence[Mapping[str, int]]) -> None:
        """Take each rank's place from its ``layout()`` (megatron): its data-parallel rank, and whether
        it takes part in exporting the weights."""
        if len(layouts) != len(self.actors):
            raise ValueError(f"{len(layouts)} layouts for {len(self.actors)} ranks")
        self.dp_ranks = [int(lay["dp_rank"]) for lay in layouts]
        self.exports = exporting_ranks(layouts)

    def _submit(self, calls: Callable[[], list[Any]]) -> list[Any]:
        """Submit one operation's calls to its ranks together (see the class docstring); the refs."""
        with self._submitting:
            return calls()

    @property
    def world_size(self) -> int:
        return len(self.actors)

    @classmethod
    def create(
        cls,
        spec: RLTrainingJobSpec,
        model_path: str,
        slots: Sequence[Slot],
        *,
        fraction: float | None = None,
        dist_timeout_s: float = 600.0,
    ) -> TrainerGroup:
        """Start one rank of spec.training.backend per slot (pinned to its bundle, its GPU on cuda) and
        join them into one process group (Megatron's TP/PP/DP groups inside it).

        ``fraction``: the share of each bundle a rank takes (num_cpus, and num_gpus on cuda);
        defaults to 0.5 when colocated (the engine takes the rest) and 1 otherwise.
        """
        import ray

        if not slots:
            raise ValueError("TrainerGroup.create: no trainer slots")
        if fraction is None:
            fraction = 0.5 if spec.resources.colocate else 1.0
        # "control": calls that must run while the rank is busy (aborting a broadcast an engine died in)
        remote = ray.remote(concurrency_groups={CONTROL_GROUP: 1})  # type: ignore[call-overload]  # not in ray's overloads
        remote_cls = remote(rank_class(spec.training.backend))
        actors = []
        for rank, slot in enumerate(slots):
            options = dict(slot.options(fraction))
            if spec.resources.device == "cuda":
                options["num_gpus"] = fraction
            options["runtime_env"] = {"env_vars": actor_env()}
            actors.append(
                remote_cls.options(**options).remote(
                    spec,
                    str(model_path),
                    rank,
                    len(slots),
                    dist_timeout_s=dist_timeout_s,
                    cpu_share=slot.share,
                )
            )
        group = cls(spec, actors)
        try:
            addr, port = ray.get(actors[0].master_address.remote())
            _gather([a.init_process_group.remote(addr, port) for a in actors])
            if spec.training.backend == "megatron":
                group.use_layouts(_gather([a.layout.remote() for a in actors]))
        except BaseException:
            group.shutdown()
            raise
        return group

    # -------------------------------------------------------------------------------- sharding

    def _check_identity(self, samples: Sequence[Sample]) -> None:
        """A rollout is rollout.batchSize * nSamplesPerPrompt samples, or (dynamic sampling out of
        rounds) fewer whole global batches: one optimizer step each."""
        rollout = self.spec.rollout
        expected = rollout.batch_size * rollout.n_samples_per_prompt
        gbs = self.spec.training.global_batch_size
        if not samples or len(samples) > expected or len(samples) % gbs:
            raise ValueError(
                f"got {len(samples)} samples; a rollout is rollout.batchSize * nSamplesPerPrompt = "
                f"{rollout.batch_size} * {rollout.n_samples_per_prompt} = {expected}, or fewer whole "
                f"global batches of {gbs}"
            )

    def _shards(self, n: int) -> list[list[int]]:
        return replica_rows(n, self.spec.training.global_batch_size, self.dp_ranks)

    def _rank_batches(self, samples: Sequence[Sample]) -> tuple[list[list[int]], list[TrainBatch]]:
        shards = self._shards(len(samples))
        return shards, [build_batch([samples[i] for i in rows]) for rows in shards]

    # ------------------------------------------------------------------------------ operations

    def logprobs(self, samples: Sequence[Sample]) -> LogProbs:
        """[N, T] log-probs (+ reference log-probs, entropy) in the samples' order, T = longest response."""
        self._check_identity(samples)
        shards, batches = self._rank_batches(samples)
        every: list[LogProbs] = _gather(
            self._submit(
                lambda: [actor.logprobs.remote(b) for actor, b in zip(self.actors, batches, strict=True)]
            )
        )
        leaders = replica_leaders(self.dp_ranks)  # one rank per replica: its peers return the same
        shards = [shards[i] for i in leaders]
        results = [every[i] for i in leaders]
        width = max(max(len(s.response_ids) for s in samples), 1)

        def assemble(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
            present = [p for p in parts if p is not None]
            if len(present) < len(parts):
                return None
            out = torch.zeros((len(samples), width), dtype=torch.float32)
            for rows, part in zip(shards, present, strict=True):
                out[torch.tensor(rows)] = pad_columns(part, width)
            return out

        logp = assemble([r.logp for r in results])
        assert logp is not None
        return LogProbs(
            logp,
            assemble([r.ref_logp for r in results]),
            assemble([r.entropy for r in results]),
            assemble([r.values for r in results]),
        )

    def train(
        self,
        samples: Sequence[Sample],
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None = None,
        *,
        values: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
    ) -> Metrics:
        """One optimizer step per global batch of the rollout; metrics averaged over the steps (all
        ranks agree). ``values`` / ``returns`` train the critic (ppo)."""
        self._check_identity(samples)
        full = build_batch(samples)
        advantages = check_per_token("advantages", advantages, full)
        old_logp, ref_logp, values, returns = (
            None if t is None else check_per_token(name, t, full)
            for name, t in (
                ("old_logp", old_logp),
                ("ref_logp", ref_logp),
                ("values", values),
                ("returns", returns),
            )
        )
        gbs = self.spec.training.global_batch_size
        reduction = self.spec.algorithm.loss_reduction
        denominators = [
            loss_denominator(full.loss_mask[start : start + gbs], reduction)
            for start in range(0, len(samples), gbs)
        ]
        shards, batches = self._rank_batches(samples)

        def calls() -> list[Any]:
            refs = []
            for actor, rows, batch in zip(self.actors, shards, batches, strict=True):
                idx = torch.tensor(rows)

                def part(t: torch.Tensor | None, idx: torch.Tensor = idx, width: int = batch.width) -> Any:
                    return None if t is None else t[idx, :width].contiguous()

                refs.append(
                    actor.train.remote(
                        batch,
                        part(advantages),
                        part(old_logp),
                        part(ref_logp),
                        denominators=denominators,
                        values=part(values),
                        returns=part(returns),
                    )
                )
            return refs

        results: list[Metrics] = _gather(self._submit(calls))
        per_rank = [results[i] for i in replica_leaders(self.dp_ranks)]  # peers report the same
        keys = per_rank[0].keys()
        return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}

    def _exporters(self) -> list[Any]:
        """The ranks that export the weights together, global rank 0 first (the one sender): data-
        parallel rank 0's replica (megatron gathers TP/PP shards; the torch backend's replica is rank
        0), and with an MoE model at expert parallel size > 1 the EP peers holding its other experts."""
        exports = [d == 0 for d in self.dp_ranks] if self.exports is None else self.exports
        return [a for a, e in zip(self.actors, exports, strict=True) if e]

    def _from_rank0(self, method: str, *args: Any) -> Any:
        return _gather(self._submit(lambda: [getattr(a, method).remote(*args) for a in self._exporters()]))[0]

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Rank 0's weights under HF names, CPU."""
        return self._from_rank0("named_tensors")

    def write_weights(self, directory: str | None, model_path: str | None) -> tuple[str, int]:
        """Rank 0 writes the weights into a scratch directory on its node (sync/disk.py)."""
        return self._from_rank0("write_weights", directory, model_path)

    def remove_weights(self, directory: str) -> None:
        _gather([self.actors[0].remove_weights.remote(directory)])

    # ---- colocated sync: rank 0 shares CUDA IPC buckets (sync/ipc.py) ------------------------------

    def begin_ipc(self, max_bucket_bytes: int, codec: str, cast: str | None) -> tuple[int, int]:
        """Export and plan on the replica's ranks (a collective for megatron); (buckets, bytes)."""
        return self._from_rank0("begin_ipc", max_bucket_bytes, codec, cast)

    def ipc_bucket_async(self, index: int) -> Any:
        """A ref to bucket ``index``'s payload, shared by rank 0 (which frees bucket ``index - 2``)."""
        return self.actors[0].ipc_bucket.remote(index)

    def get(self, ref: Any) -> Any:
        return _gather([ref])[0]

    def end_ipc(self) -> dict[str, float]:
        return _gather([self.actors[0].end_ipc.remote()])[0]

    # ---- disaggregated sync: rank 0 hosts an NCCL group with the engines (sync/distributed.py) ------

    def weight_group_address(self) -> tuple[str, int]:
        return _gather([self.actors[0].weight_group_address.remote()])[0]

    def init_weight_update_group(
        self, address: str, port: int, world_size: int, group_name: str, backend: str
    ) -> Any:
        """Start rank 0's side (it blocks until the engines joined): a ref for the caller to await
        while it asks the engines to join."""
        return self.actors[0].init_weight_update_group.remote(address, port, world_size, group_name, backend)

    def weight_bucket_specs(self, max_bytes: int, cast: str | None = None) -> list[Any]:
        return self._from_rank0("weight_bucket_specs", max_bytes, cast)

    def broadcast_weights(self, specs: list[Any]) -> list[Any]:
        """Refs of the replica's ranks sending ``specs`` (rank 0's answer first); the caller awaits
        them while the engines receive."""
        return self._submit(lambda: [a.broadcast_weights.remote(specs) for a in self._exporters()])

    def abort_weight_update_group(self) -> None:
        """Unblock rank 0's broadcast when an engine died in it: runs in the rank's "control"
        concurrency group, beside the broadcast that waits (``TrainerGroup.create`` declares it)."""
        ref = self.actors[0].abort_weight_update_group.options(concurrency_group=CONTROL_GROUP).remote()
        _gather([ref], timeout_s=60)

    def wait(self, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        """The results of refs returned by ``init_weight_update_group`` / ``broadcast_weights``."""
        return _gather(refs, timeout_s=timeout_s)

    def close_weight_update_group(self) -> None:
        _gather([self.actors[0].close_weight_update_group.remote()])

    # ---- colocated turns (colocation.Turns): the state off the GPU while the engines generate -----

    def offload(self) -> list[dict[str, float]]:
        """Every rank's parameters, gradients and optimizer state to pinned CPU memory; per rank its
        GPU memory after (``trainer/offload.py``)."""
        return _gather(self._submit(lambda: [a.offload.remote() for a in self.actors]))

    def onload(self) -> list[dict[str, float]]:
        return _gather(self._submit(lambda: [a.onload.remote() for a in self.actors]))

    def memory_use(self) -> list[dict[str, float]]:
        return _gather(self._submit(lambda: [a.memory_use.remote() for a in self.actors]))

    def save(self, path: str) -> None:
        _gather(self._submit(lambda: [a.save.remote(str(path)) for a in self.actors]))

    def load(self, path: str) -> None:
        _gather(self._submit(lambda: [a.load.remote(str(path)) for a in self.actors]))

    def set_seed(self, seed: int) -> None:
        _gather(self._submit(lambda: [a.set_seed.remote(seed) for a in self.actors]))

    def lost_ranks(self, timeout_s: float = 10.0) -> list[int]:
        """Ranks whose process is gone (killed, its node lost). A rank busy in a long call does not
        answer within ``timeout_s`` and counts as alive: only a dead actor answers with an error."""
        import ray
        from ray.exceptions import RayActorError

        refs = [actor.__ray_ready__.remote() for actor in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        lost = []
        for rank, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except RayActorError:
                    lost.append(rank)
        return lost

    def shutdown(self) -> None:
        """Leave the process group and kill every rank (idempotent)."""
        import ray

        actors, self.actors = self.actors, []
        if not actors:
            return
        try:
            ray.wait([a.shutdown.remote() for a in actors], num_returns=len(actors), timeout=10)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
