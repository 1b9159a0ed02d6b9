"""The ``megatron`` backend's rank: a Megatron-core GPTModel (TP/PP from the spec), Megatron DDP and
its distributed optimizer (bf16 weights, fp32 main params and grads), one process per GPU.

It offers what ``base.TrainerRank`` asks of a rank, computing log-probs with ``algo.logprobs`` and
the loss with ``algo.losses.policy_loss`` exactly as the torch backend does (``train``'s template and
the micro-batch loss are theirs in common: ``rank_base.TrainerRankBase``): each micro-batch's loss
is divided by the *global* batch's denominator, so the summed gradient is the global batch's. Megatron
divides a returned loss by the number of micro-batches and averages gradients over data-parallel
ranks; the loss handed to it is scaled up by both so that the sum survives.

Rows: every rank of one model replica (its TP x PP group) must get the same rows; data-parallel
ranks get their ``rank_rows`` share, as with the torch backend (dp = GPUs / (tp * pp * cp)).
Checkpoints: ``checkpoint.py`` (layout, HF export) and ``dist_checkpoint.py`` (Megatron torch_dist:
model, optimizer, step, RNG), resumed at any TP/PP/DP layout. ``model.megatronCheckpoint``: the initial
weights (policy and reference) come from that torch_dist checkpoint instead of model.path's HF weights.
Adam: torch's AdamW (megatron-core's choice without TE/apex), switched to its fused kernel on GPU
(``fusions.use_fused_adam``). ``training.fusions`` (``fusions.FUSIONS``: compiled SwiGLU, RMSNorm and
RoPE, gradient-accumulation fusion; all by default) and ``training.lmHead`` (``lm_head.py``'s chunked
head by default: log-probs and entropy from the last hidden states a chunk of tokens at a time) shape
the model: ``policy.model_options`` reads them from the spec and ``policy.build_policy`` builds the
policy with them, the one path a job and the MFU benchmark (benchmarks/gpu/megatron_mfu.py) take.
Dynamic batching (``training.dynamicBatch``): packed micro-batches through megatron-core's "thd"
packed-sequence parameters (``schedule.py``, ``attention.py``). ``training.offloadOptimizer``: the
optimizer state streamed from host memory (``optimizer_offload.py``); ``memory_plan.py`` refuses a
layout that cannot fit the GPU before anything is built. ``training.megatronArgs``: an allow-list
(``megatron_args.py``). advantageEstimator ppo: a critic (``critic.py``) trained after each policy
step and checkpointed beside it. MoE (``moe.py``, ``expert_parallel.py``): experts split over
training.parallelism.expert of the data-parallel ranks. Not yet: context parallelism (``checks.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rljob_api.spec import RLTrainingJobSpec

from ..base import LogProbs, Metrics, TrainBatch, lr_at, pad_columns
from ..critic import CRITIC_DIR
from ..offload import Group, module_tensors, optimizer_tensors
from ..rank_base import TrainerRankBase, needs_reference, set_seed
from .checkpoint import find_dist_checkpoint, read_hf_state
from .checks import check_megatron
from .critic import MegatronCritic
from .expert_parallel import dispatchable, exports_weights
from .memory_plan import check_this_gpu
from .policy import build_policy, build_reference, ddp_grad_tensors, ddp_weight_tensors, model_options
from .routing_replay import RoutingReplay, model_replays
from .schedule import (
    accumulate,
    from_last_stage,
    reduce_metrics,
    run_schedule,
    swap_entropy,
    token_stats,
)


class MegatronTrainerRank(TrainerRankBase):
    """One GPU of the megatron backend (see the module docstring)."""

    def __init__(
        self,
        spec: RLTrainingJobSpec,
        model_path: str,
        rank: int = 0,
        world_size: int = 1,
        *,
        dist_timeout_s: float = 600.0,
        distributed_optimizer: bool = True,
        fusions: Iterable[str] | None = None,
        cpu_share: int = 1,
    ) -> None:
        # Everything that can be refused is refused here (prepare.prepare did it too), before any
        # process group or GPU memory.
        super().__init__(
            spec, model_path, rank, world_size, dist_timeout_s=dist_timeout_s, cpu_share=cpu_share
        )
        self.shape, self.par = check_megatron(spec, self.model_path, gpus=world_size)
        if spec.model.megatron_checkpoint is not None:  # its tensors are checked when loaded (_build)
            find_dist_checkpoint(spec.model.megatron_checkpoint)
        self.dtype: torch.dtype = getattr(torch, spec.model.dtype)
        self.memory_estimate = check_this_gpu(self.shape, spec, self.par, self.rank)
        self.distributed_optimizer = distributed_optimizer  # False: plain per-rank Adam (CPU smoke tests)
        # training.fusions / lmHead / recompute / megatronArgs; ``fusions`` overrides the spec's (tests).
        self.options = model_options(spec, fusions)
        self.fusions = self.options.fusions
        self._default_fusions = fusions is None and spec.training.fusions is None
        self.model: Any = None
        self.ref_model: Any = None
        self.head: Any = None  # lm_head.ChunkedHead of the policy (training.lmHead chunked, last stage)
        self.ref_head: Any = None
        self.optimizer_offload: Any = None  # optimizer_offload.OptimizerStateOffload with offloadOptimizer
        self.critic: MegatronCritic | None = None  # advantageEstimator ppo (critic.py)
        # training.routingReplay: the policy's and the reference's routers (routing_replay.model_replays)
        self.replay: RoutingReplay | None = None
        self.ref_replay: RoutingReplay | None = None

    @property
    def dp_size(self) -> int:
        return self.par.dp

    # ----------------------------------------------------------------------------- distributed

    def layout(self) -> dict[str, int]:
        """Where this rank sits (after ``init_process_group``): ranks of one model replica (same
        data-parallel rank) take the same rows; the group reads results from one of them."""
        from megatron.core import parallel_state as ps

        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "tp": self.par.tp,
            "pp": self.par.pp,
            "cp": self.par.cp,
            "dp": self.par.dp,
            "dp_rank": ps.get_data_parallel_rank(),
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "ep": self.par.ep,
            "ep_rank": ps.get_expert_model_parallel_rank(),
            "exports_weights": int(exports_weights(self.shape.moe is not None)),
        }

    def init_process_group(self, master_addr: str, master_port: int) -> None:
        """Join the NCCL group, create Megatron's groups, build the model(s) and the optimizer."""
        # Ray shows each rank its GPU as cuda:0; torchrun sets LOCAL_RANK.
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(
                backend="nccl",
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.dist_timeout_s),
                device_id=self.device,
            )
        self._build()

    def _build(self) -> None:
        from .model import init_model_parallel

        spec = self.spec
        set_seed(spec.training.seed)
        init_model_parallel(self.par, spec.training.seed)
        if self.device.type != "cuda" and self._default_fusions:
            # The compiled fusions are GPU work: a rank without a GPU (only the project's CPU tests run
            # megatron there) would compile them with a C++ toolchain for nothing. Named ones still apply.
            self.options = replace(self.options, fusions=frozenset())
            self.fusions = self.options.fusions
        if self.rank == 0:  # what training.fusions / lmHead made of the model, for the job's log
            head = "chunked" if self.options.chunked_head else "full"
            print(
                f"megatron: fusions {', '.join(sorted(self.fusions)) or 'none'}; LM head {head}", flush=True
            )
        initial = self._initial_weights()
        policy = build_policy(
            spec,
            self.options,
            self.shape,
            self.par,
            dtype=self.dtype,
            device=self.device,
            initial=initial,
            distributed_optimizer=self.distributed_optimizer,
        )
        self.model, self.optimizer = policy.model, policy.optimizer
        self.optimizer_offload, self.head = policy.offload, policy.head
        if needs_reference(spec):
            self.ref_model, self.ref_head = build_reference(
                self.options, self.shape, self.par, dtype=self.dtype, initial=initial
            )
        if spec.training.routing_replay:
            self.replay, self.ref_replay = model_replays(self.model, self.ref_model, self.shape, self.packing)
        if spec.algorithm.advantage_estimator == "ppo":
            self.critic = MegatronCritic.build(
                spec,
                self.options,
                self.par,
                model_path=self.model_path,
                dtype=self.dtype,
                device=self.device,
                distributed_optimizer=self.distributed_optimizer,
            )
        self.model.train()

    def _initial_weights(self) -> Callable[[torch.nn.Module], None]:
        """What fills a freshly built model (policy and reference): model.megatronCheckpoint's torch_dist
        weights when the spec names one (any layout saved it; a tensor it lacks or holds with another
        shape is refused by name), else model.path's HF weights (read once for both models)."""
        from . import dist_checkpoint as dcp
        from .model import load_hf_weights

        source = self.spec.model.megatron_checkpoint
        if source is not None:
            return lambda model: dcp.load_model_weights(source, model)
        hf = read_hf_state(self.model_path)
        return lambda model: load_hf_weights(model, hf, self.shape, self.par)

    # -------------------------------------------------------------------------------- forward

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> LogProbs:
        """Log-probs, reference log-probs and entropy of this rank's rows, [B, T] on CPU, over exactly
        the micro-batches ``train`` uses (a first on-policy step then has ppo_kl == 0)."""
        from ..base import place_rows

        self._require_resident("logprobs")
        plan = [rows for step in self._plan(batch) for rows in step]
        mbs = dispatchable([batch.select(rows) for rows in plan], self.model.config, self.par.ep)
        packed = self.packing

        def collect(
            head: Any, mb: TrainBatch, logits: torch.Tensor, entropy: str | None
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            logp, ent = token_stats(
                logits, mb, self.shape.vocab_size, self.temperature, entropy, packed=packed, head=head
            )
            out = {"logp": pad_columns(logp.float().cpu(), batch.width)}
            if ent is not None:
                out["entropy"] = pad_columns(ent.float().cpu(), batch.width)
            return logits.new_zeros(()), out

        self.model.eval()
        try:
            policy = run_schedule(
                self.model,
                mbs,
                partial(swap_entropy, partial(collect, self.head), "metric"),
                forward_only=True,
                device=self.device,
                packed=packed,
                replay=self.replay,
            )
            ref = None
            if self.ref_model is not None:
                ref = run_schedule(
                    self.ref_model,
                    mbs,
                    partial(swap_entropy, partial(collect, self.ref_head), None),
                    forward_only=True,
                    device=self.device,
                    packed=packed,
                    replay=self.ref_replay,
                )
        finally:
            self.model.train()
        policy, ref = from_last_stage((policy, ref), self.par.pp)
        values = None if self.critic is None else self.critic.values(mbs, batch.width, packed=packed)

        def place(results: list[dict[str, Any]], key: str) -> torch.Tensor:
            # Micro-batches are in plan order, which token-budget micro-batches do not keep for rows.
            return place_rows(
                list(zip(plan, (d[key] for d in results), strict=True)), batch.size, batch.width
            )

        return LogProbs(
            logp=place(policy, "logp"),
            ref_logp=None if ref is None else place(ref, "logp"),
            entropy=place(policy, "entropy"),
            values=None if values is None else place([{"v": v} for v in values], "v"),
        )

    # ------------------------------------------------------------------------------- training

    def _sum_over_dp(self, counts: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        counts = counts.to(self.device)
        dist.all_reduce(counts, group=ps.get_data_parallel_group())
        return counts

    def _optimizer_step(
        self,
        batch: TrainBatch,
        micro_batches: list[slice | list[int]],
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        denominator: float,
    ) -> Metrics:
        from megatron.core import parallel_state as ps

        algo = self.spec.algorithm
        entropy = "grad" if algo.entropy_coef > 0 else "metric"
        # Megatron divides the returned loss by the micro-batch count and averages grads over DP ranks.
        scale = float(len(micro_batches) * self.par.dp)
        sums: dict[str, torch.Tensor] = {}

        packed = self.packing

        def loss_fn(
            rows: slice | list[int], mb: TrainBatch, logits: torch.Tensor
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            logp, ent = token_stats(
                logits, mb, self.shape.vocab_size, self.temperature, entropy, packed=packed, head=self.head
            )
            loss, metrics, mask = self._micro_batch_loss(
                mb, rows, logp, ent, advantages, old_logp, ref_logp, denominator
            )
            accumulate(sums, metrics, mask)
            return loss * scale, {}

        mbs = dispatchable([batch.select(rows) for rows in micro_batches], self.model.config, self.par.ep)
        row_iter = iter(micro_batches)
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        run_schedule(
            self.model,
            mbs,
            lambda mb, logits: loss_fn(next(row_iter), mb, logits),
            forward_only=False,
            device=self.device,
            packed=packed,
            replay=self.replay,
        )
        lr = lr_at(self.step, self.spec.training.optimizer, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        stepped, grad_norm, _ = self.optimizer.step()
        out = reduce_metrics(sums, ps.get_data_parallel_group(), self.par.pp)
        out.update(
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=lr,
            skipped_step=0.0 if stepped else 1.0,
        )
        return out

    def _critic_step(
        self,
        batch: TrainBatch,
        micro_batches: list[slice | list[int]],
        old_values: torch.Tensor,
        returns: torch.Tensor,
        denominator: float,
    ) -> Metrics:
        assert self.critic is not None
        algo = self.spec.algorithm
        return self.critic.step(
            batch,
            micro_batches,
            old_values,
            returns,
            value_clip=algo.critic.value_clip,
            reduction=algo.loss_reduction,
            denominator=denominator,
            lr=lr_at(self.step, self.critic.opt, self.total_steps),
            packed=self.packing,
        )

    # -------------------------------------------------------------------------------- weights

    def device_weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights under HF names, whole (gathered over TP, merged over PP, an MoE model's
        experts gathered over EP), on this GPU, on the first rank of the replica (tp = pp = ep = 0); {}
        on its other ranks. A collective of the replica's TP x PP ranks and their EP peers
        (``expert_parallel.exports_weights``). Tied models carry no lm_head.weight (as in their safetensors).
        With pp > 1 the other stages travel through the CPU (gather_object): simple, not fast."""
        from megatron.core import parallel_state as ps

        from .model import export_hf_weights

        stage = export_hf_weights(self.model, self.shape, self.par)
        pp_rank = ps.get_pipeline_model_parallel_rank()
        # The sender: TP and EP rank 0 (the EP peers gathered the same experts).
        first = ps.get_tensor_model_parallel_rank() == 0 and ps.get_expert_model_parallel_rank() == 0
        if self.par.pp > 1:
            group = ps.get_pipeline_model_parallel_group()
            stages: list[Any] | None = [None] * self.par.pp if pp_rank == 0 else None
            # Stage 0 of each PP group collects; only the sender's copy goes (TP / EP peers hold it too).
            mine = {k: v.cpu() for k, v in stage.items()} if first and pp_rank > 0 else None
            dist.gather_object(mine, stages, dst=dist.get_global_rank(group, 0), group=group)
            device = next(iter(stage.values())).device
            for part in stages or []:
                stage.update({k: v.to(device) for k, v in (part or {}).items()})
        return stage if first and pp_rank == 0 else {}

    def _offload_groups(self) -> dict[str, Group]:
        """What leaves the GPU in a colocated job's engine turn (``offload.Offloadable``): the bf16
        parameters (views into DDP's param buffers), the fp32 gradient buffers (rewritten every step:
        not copied), the optimizer's fp32 main parameters and moments, the reference model, and the
        critic's weights, gradients and optimizer state (ppo) in the same groups
        (``policy.ddp_weight_tensors``, ``ddp_grad_tensors``)."""
        critic = self.critic
        return {
            "weights": Group(
                lambda: [*ddp_weight_tensors(self.model), *(critic.weight_tensors() if critic else [])]
            ),
            "grads": Group(
                lambda: [*ddp_grad_tensors(self.model), *(critic.grad_tensors() if critic else [])],
                keep=False,
            ),
            "training": Group(
                lambda: [
                    *optimizer_tensors(self.optimizer),
                    *module_tensors(self.ref_model),
                    *(critic.optimizer_tensors() if critic else []),
                ]
            ),
        }

    def save(self, path: str) -> None:
        """``path/model``: the HF export (global rank 0); ``path/dist``: the Megatron distributed
        checkpoint of model, optimizer, step and every rank's RNG (``dist_checkpoint``), which any
        layout loads; ``path/critic``: the critic's model and optimizer (ppo), another. A collective of every rank; when any rank fails to write, every rank raises
        (``CheckpointWriteError`` for write failures) instead of waiting for it."""
        self._require_resident("save")
        from megatron.core import tensor_parallel

        from . import checkpoint as ckpt
        from . import dist_checkpoint as dcp

        # Every replica holds the same weights: only data-parallel rank 0's ranks (and the EP peers
        # holding the rest of its experts) export them.
        named = self.named_tensors() if exports_weights(self.shape.moe is not None) else {}
        mine = {
            "rank": self.rank,
            **{k: v for k, v in self.layout().items() if k.endswith("_rank")},
            "state": ckpt.portable_rng_state(tensor_parallel.get_cuda_rng_tracker().get_states()),
        }
        rngs: list[Any] = [None] * self.world_size
        dist.all_gather_object(rngs, mine)  # common state must be equal on every rank: all of them
        common = {"rljob": {"step": self.step, "layout": self._saved_layout(), "rng": rngs}}

        def export() -> None:
            ckpt.write_hf_model(named, self.model_path, ckpt.model_dir(path))

        with self._optimizer_state_resident():
            dcp.save_trainer_state(
                ckpt.dist_dir(path), self.model, self.optimizer, common, rank_zero_files=export
            )
        if self.critic is not None:
            self.critic.save(str(Path(path) / CRITIC_DIR))

    def load(self, path: str) -> None:
        """Restore ``save``'s checkpoint at this run's layout, whatever layout saved it: weights, fp32
        main params and moments from ``path/dist``, the step, and the RNG states that map
        (``checkpoint.pick_rng``: all of them at the same layout)."""
        self._require_resident("load")
        from megatron.core import tensor_parallel

        from . import checkpoint as ckpt
        from . import dist_checkpoint as dcp

        found = ckpt.find_dist_checkpoint(path)
        critic = found.parent / CRITIC_DIR
        if self.critic is not None and not ckpt.is_dist_checkpoint(critic):  # before anything is read
            raise FileNotFoundError(
                f"no critic in checkpoint {found.parent} (advantageEstimator ppo needs {critic}): it was "
                "saved by a run without a critic; start from its HF export instead"
            )
        with self._optimizer_state_resident():
            state = dcp.load_trainer_state(found, self.model, self.optimizer)["rljob"]
        if self.critic is not None:
            self.critic.load(str(critic))
        self.step = int(state["step"])
        rng, tracker_applies, _ = ckpt.pick_rng(
            state["rng"], state["layout"], self._saved_layout(), self.layout()
        )
        tracker = ckpt.restore_rng_state(rng)
        if tracker_applies and tracker:
            tensor_parallel.get_cuda_rng_tracker().set_states(tracker)
        dist.barrier()

    def _optimizer_state_resident(self) -> contextlib.AbstractContextManager[Any]:
        """With offloadOptimizer, the whole optimizer state on the GPU while a checkpoint reads or
        writes it (it lives in host memory between steps)."""
        offload = self.optimizer_offload
        return offload.resident() if offload is not None else contextlib.nullcontext()

    def _saved_layout(self) -> dict[str, int]:
        par = self.par
        return {"world_size": self.world_size, "tp": par.tp, "pp": par.pp, "dp": par.dp, "ep": par.ep}

    def shutdown(self) -> None:
        from megatron.core import parallel_state as ps

        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        super().shutdown()
