"""What the torch and megatron ranks share: the rank's identity and schedule position, seeding, the
rendezvous address, the micro-batch plan (microBatchSize rows, or with training.dynamicBatch rows
packed up to maxTokensPerGpu tokens: ``algo.packing``), and ``train``'s template (one optimizer step per global
batch, each micro-batch's policy loss over the *global* batch's denominator, metrics averaged over
the steps). A backend provides the optimizer step itself (``_optimizer_step``: its forward/backward
and optimizer), how a step's loss counts are summed over its data-parallel ranks (``_sum_over_dp``)
and its data-parallel size (``dp_size``); the ppo critic (``_critic_targets``, ``_critic_step``) is
the torch backend's alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rljob_api.spec import RLTrainingJobSpec

from ..algo.batching import steps_per_rollout
from ..algo.losses import policy_loss
from ..algo.packing import plan_micro_batches
from ..cpu_threads import threads_for
from ..models.resolve import model_on_this_node
from ..net import free_port, node_ip
from .base import (
    Metrics,
    Rows,
    TrainBatch,
    check_per_token,
    check_policy_inputs,
    local_plan,
    mean_metrics,
    step_counts,
)
from .offload import Offloadable
from .weight_source import WeightSource

# Metrics of algo.losses.policy_loss that are reduced with the global denominator: their micro-batch
# values add up (over micro-batches and ranks) to the global batch's value. The others are masked
# means of their micro-batch and are averaged weighted by trained tokens.
SUMMED_METRICS = frozenset({"loss", "pg_loss", "entropy", "kl_loss", "value_loss"})


def needs_reference(spec: RLTrainingJobSpec) -> bool:
    """A frozen reference model is loaded for the KL loss or klCoef reward shaping."""
    return spec.algorithm.use_kl_loss or spec.algorithm.kl_coef > 0


def skips_logprobs_pass(spec: RLTrainingJobSpec, num_samples: int) -> bool:
    """Whether a rollout can train without the no-grad log-prob pass before it: its samples are one
    global batch, so the one optimizer step starts from the policy that the old log-probs are of,
    and its own forward pass gives them (about a quarter of a step's training time saved); and
    nothing else needs the pass: no reference model (KL) and no critic (ppo's values)."""
    algo = spec.algorithm
    one_step = num_samples == spec.training.global_batch_size
    return one_step and not needs_reference(spec) and algo.advantage_estimator != "ppo"


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class TrainerRankBase(Offloadable, WeightSource):
    """A trainer rank (``base.TrainerRank``) less what its backend does differently (see the module
    docstring)."""

    def __init__(
        self,
        spec: RLTrainingJobSpec,
        model_path: str,
        rank: int,
        world_size: int,
        *,
        dist_timeout_s: float,
        cpu_share: int = 1,
    ) -> None:
        """``cpu_share``: the job's processes on this node that run at once (``placement.Slot.share``);
        on device cpu the rank takes its part of the node's cores as torch threads."""
        self.spec = spec
        if spec.resources.device == "cpu":
            torch.set_num_threads(threads_for(cpu_share))
        self.model_path = model_on_this_node(spec.model.path, model_path)
        self.rank, self.world_size = rank, world_size
        self.dist_timeout_s = dist_timeout_s
        self.temperature = spec.rollout.temperature if spec.rollout.temperature > 0 else 1.0
        self.steps_per_rollout = steps_per_rollout(
            spec.rollout.batch_size, spec.rollout.n_samples_per_prompt, spec.training.global_batch_size
        )
        self.total_steps = spec.training.num_rollout * self.steps_per_rollout
        self.step = 0  # optimizer steps taken
        self.critic: Any = None  # the backend's value model (advantageEstimator ppo), None without one

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: each trains on its 1/dp_size share of every global batch."""
        raise NotImplementedError

    def master_address(self) -> tuple[str, int]:
        """This node's IP (Ray's view of it) and a free port, for the rendezvous (asked of rank 0)."""
        return node_ip(), free_port()

    def set_seed(self, seed: int) -> None:
        set_seed(seed)

    @property
    def packing(self) -> bool:
        """training.dynamicBatch: micro-batches packed by token count (``TrainBatch.packed``)."""
        return self.spec.training.dynamic_batch.enabled

    def _plan(self, batch: TrainBatch, *, strict: bool = False) -> list[list[Rows]]:
        """The micro-batches of ``batch``'s rows per optimizer step (each step is this rank's share of a
        global batch, in order). ``logprobs`` and ``train`` use the same plan, so that a first step is
        bit-for-bit on-policy. A size that is no whole number of steps (``strict``: refused) is one
        step's worth of micro-batches."""
        size = batch.size
        per_rank = self.spec.training.global_batch_size // self.dp_size
        dyn = self.spec.training.dynamic_batch
        whole = size % per_rank == 0
        if strict and not whole:
            raise ValueError(f"{size} rows do not split into steps of {per_rank}")
        if dyn.enabled:
            lengths = batch.sequence_lengths()
            starts = range(0, size, per_rank) if whole else [0]
            width = per_rank if whole else size
            return [
                [
                    [start + i for i in mb]
                    for mb in plan_micro_batches(lengths[start : start + width], dyn.max_tokens_per_gpu)
                ]
                for start in starts
            ]
        mbs = self.spec.training.micro_batch_size
        if strict or (whole and per_rank % mbs == 0):
            return [list[Rows](step) for step in local_plan(size, per_rank, mbs)]
        return [[slice(i, min(i + mbs, size)) for i in range(0, size, mbs)]]

    # ------------------------------------------------------------------------------- training

    def train(
        self,
        batch: TrainBatch,
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None = None,
        denominators: Sequence[float] | None = None,
        *,
        values: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
    ) -> Metrics:
        """This rank's share of a rollout: its rows of every global batch, in order (``rank_rows``).

        Takes one optimizer step per global batch, over micro-batches of microBatchSize rows (or with
        training.dynamicBatch packed up to maxTokensPerGpu tokens).
        ``denominators``: per step, the global batch's loss denominator (``loss_denominator``);
        computed here with an all-reduce when not given. ``values`` (from ``logprobs``) and
        ``returns`` train the critic (ppo: required). ``old_logp`` None: one optimizer step, whose
        forward pass gives the old log-probs too (``skips_logprobs_pass``). Returns metrics averaged
        over the steps, identical on every rank.
        """
        self._require_resident("train")
        spec = self.spec
        algo = spec.algorithm
        plan = self._plan(batch, strict=True)
        advantages, old_logp, ref_logp = check_policy_inputs(
            batch, advantages, old_logp, ref_logp, algo.use_kl_loss
        )
        if old_logp is None and len(plan) != 1:
            raise ValueError(
                f"old_logp is needed for a rollout of {len(plan)} optimizer steps: after the first, "
                "the policy has moved away from the one that generated the samples"
            )
        critic_targets = self._critic_targets(batch, values, returns)
        if denominators is None:
            counts = step_counts(batch, plan, algo.loss_reduction)
            denominators = self._sum_over_dp(counts).clamp(min=1.0).tolist()
        if len(denominators) != len(plan):
            raise ValueError(f"{len(denominators)} denominators for {len(plan)} optimizer steps")

        per_step: list[Metrics] = []
        for step_slices, denominator in zip(plan, denominators, strict=True):
            metrics = self._optimizer_step(
                batch, step_slices, advantages, old_logp, ref_logp, float(denominator)
            )
            if critic_targets is not None:  # before the policy's step count moves: same lr index
                metrics.update(self._critic_step(batch, step_slices, *critic_targets, float(denominator)))
            if not metrics["skipped_step"]:
                self.step += 1
            per_step.append(metrics)
        return mean_metrics(per_step)

    def _micro_batch_loss(
        self,
        mb: TrainBatch,
        rows: Rows,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        denominator: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """The policy loss of micro-batch ``mb`` (rows ``rows`` of its step's batch) from its log-probs
        and entropy; (loss, its metrics, the micro-batch's loss mask), on this rank's device."""

        def cut(t: torch.Tensor) -> torch.Tensor:
            return t[rows, : mb.width].to(self.device)

        mask = mb.loss_mask.to(self.device)
        loss, metrics = policy_loss(
            self.spec.algorithm,
            logp,
            logp.detach() if old_logp is None else cut(old_logp),  # None: this forward's are the old
            cut(advantages),
            mask,
            entropy=entropy,
            ref_logp=None if ref_logp is None else cut(ref_logp),
            rollout_logp=None if mb.rollout_logp is None else mb.rollout_logp.to(self.device),
            denominator=denominator,
        )
        return loss, metrics, mask

    def _optimizer_step(
        self,
        batch: TrainBatch,
        micro_batches: list[Rows],
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        denominator: float,
    ) -> Metrics:
        """One policy optimizer step over ``micro_batches`` (the step counter is moved by ``train``);
        its metrics, with ``skipped_step`` (1.0 when inf/nan gradients skipped it)."""
        raise NotImplementedError

    def _sum_over_dp(self, counts: torch.Tensor) -> torch.Tensor:
        """``counts`` (this rank's, per step) summed over the data-parallel ranks."""
        raise NotImplementedError

    def _critic_targets(
        self, batch: TrainBatch, values: torch.Tensor | None, returns: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The critic's (old values, returns), checked against the batch; None: no critic."""
        if self.critic is None:
            return None
        if values is None or returns is None:
            raise ValueError("advantageEstimator ppo needs the critic's values and the returns")
        return check_per_token("values", values, batch), check_per_token("returns", returns, batch)

    def _critic_step(
        self,
        batch: TrainBatch,
        micro_batches: list[Rows],
        old_values: torch.Tensor,
        returns: torch.Tensor,
        denominator: float,
    ) -> Metrics:
        raise NotImplementedError

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
