"""The ``megatron`` backend's rank: a Megatron-core GPTModel (TP/PP from the spec), Megatron DDP and
its distributed optimizer (bf16 weights, fp32 main params and grads), one process per GPU.

It offers what ``base.TrainerRank`` asks of a rank, computing log-probs with ``algo.logprobs`` and
the loss with ``algo.losses.policy_loss`` exactly as the torch backend does: each micro-batch's loss
is divided by the *global* batch's denominator, so the summed gradient is the global batch's. Megatron
divides a returned loss by the number of micro-batches and averages gradients over data-parallel
ranks; the loss handed to it is scaled up by both so that the sum survives.

Rows: every rank of one model replica (its TP x PP group) must get the same rows; data-parallel
ranks get their ``rank_rows`` share, as with the torch backend (dp = GPUs / (tp * pp * cp)).
Not yet: checkpoints (``save``/``load``), the ppo critic, dynamic batching, context parallelism.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rljob_api.spec import RLTrainingJobSpec

from ...algo.batching import steps_per_rollout
from ...algo.logprobs import entropy_from_logits, token_logprobs
from ...algo.losses import policy_loss
from ..base import LogProbs, Metrics, TrainBatch, check_per_token, local_plan, lr_at, pad_columns
from ..torch_backend import SUMMED_METRICS, needs_reference, set_seed
from .arch import model_shape
from .parallel import validate_parallelism


def _hf_state(model_path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {model_path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


class MegatronTrainerRank:
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
    ) -> None:
        # Everything that can be refused is refused here, before any process group or GPU memory.
        training = spec.training
        if training.dynamic_batch.enabled:
            raise NotImplementedError("training.dynamicBatch is not implemented by the megatron backend yet")
        if spec.algorithm.advantage_estimator == "ppo":
            raise NotImplementedError(
                "advantageEstimator ppo (a critic) is not implemented by the megatron backend yet"
            )
        par = training.parallelism
        if par.expert != 1 or par.sequence_parallel:
            raise NotImplementedError(
                "expert and sequence parallelism need TransformerEngine (not in the local spec)"
            )
        self.hf_config = json.loads((Path(model_path) / "config.json").read_text())
        self.shape = model_shape(self.hf_config)
        self.par = validate_parallelism(
            self.shape, tp=par.tensor, pp=par.pipeline, cp=par.context, gpus=world_size
        )
        if training.global_batch_size % self.par.dp:
            raise ValueError(
                f"globalBatchSize {training.global_batch_size} does not split over {self.par.dp} data-parallel ranks"
            )
        self.spec, self.model_path = spec, str(model_path)
        self.rank, self.world_size, self.dist_timeout_s = rank, world_size, dist_timeout_s
        self.dtype: torch.dtype = getattr(torch, spec.model.dtype)
        self.temperature = spec.rollout.temperature if spec.rollout.temperature > 0 else 1.0
        self.total_steps = training.num_rollout * steps_per_rollout(
            spec.rollout.batch_size, spec.rollout.n_samples_per_prompt, training.global_batch_size
        )
        self.step = 0
        self.distributed_optimizer = distributed_optimizer  # False: plain per-rank Adam (CPU smoke tests)
        self.model: Any = None
        self.ref_model: Any = None

    # ----------------------------------------------------------------------------- distributed

    def master_address(self) -> tuple[str, int]:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return socket.gethostbyname(socket.gethostname()), port

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
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from .model import build_gpt_model, init_model_parallel, load_hf_weights

        spec = self.spec
        set_seed(spec.training.seed)
        init_model_parallel(self.par, spec.training.seed)
        hf = _hf_state(self.model_path)
        recompute = "full" if spec.training.recompute_activations else None
        model = build_gpt_model(self.shape, self.par, dtype=self.dtype, recompute=recompute)
        load_hf_weights(model, hf, self.shape, self.par)  # before the optimizer copies its main params
        ddp = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.distributed_optimizer,
        )
        self.model = DistributedDataParallel(config=model.config, ddp_config=ddp, module=model)
        opt = spec.training.optimizer
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=opt.lr,
                min_lr=opt.min_lr,
                weight_decay=opt.weight_decay,
                adam_beta1=opt.adam_beta1,
                adam_beta2=opt.adam_beta2,
                adam_eps=opt.adam_eps,
                # Megatron reports the grad norm only while clipping: "no clipping" is a huge clip.
                clip_grad=opt.clip_grad if opt.clip_grad > 0 else 1e30,
                bf16=self.dtype == torch.bfloat16,
                params_dtype=self.dtype,
                use_distributed_optimizer=self.distributed_optimizer,
            ),
            [self.model],
            use_gloo_process_groups=False,  # init_model_parallel creates NCCL groups only
        )
        config = model.config
        config.finalize_model_grads_func = finalize_model_grads  # DP grad all-reduce, tied-embedding sync
        config.grad_scale_func = self.optimizer.scale_loss
        config.no_sync_func = self.model.no_sync
        if needs_reference(spec):
            ref = build_gpt_model(self.shape, self.par, dtype=self.dtype)
            load_hf_weights(ref, hf, self.shape, self.par)
            self.ref_model = ref.eval().requires_grad_(False)
        self.model.train()

    def set_seed(self, seed: int) -> None:
        set_seed(seed)

    # -------------------------------------------------------------------------------- forward

    def _token_stats(
        self, logits: torch.Tensor, mb: TrainBatch, entropy: str | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[b, T] log-probs of the response tokens (logits / temperature, vocab padding dropped) and
        entropy: "grad", "metric" (no graph) or None."""
        logits = logits[..., : self.shape.vocab_size]
        rows = torch.arange(mb.size, device=self.device)[:, None]
        picked = logits[rows, mb.logit_positions().to(self.device)]  # [b, T, V]
        valid = mb.response_mask().to(self.device) > 0
        logp = torch.where(
            valid, token_logprobs(picked, mb.response_ids.to(self.device), self.temperature), 0.0
        )
        ent = None
        if entropy == "grad":
            ent = torch.where(valid, entropy_from_logits(picked, self.temperature), 0.0)
        elif entropy == "metric":
            with torch.no_grad():
                ent = torch.where(valid, entropy_from_logits(picked.detach(), self.temperature), 0.0)
        return logp, ent

    def _schedule(
        self,
        model: Any,
        micro_batches: list[TrainBatch],
        loss_fn: Callable[[TrainBatch, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]],
        forward_only: bool,
    ) -> list[dict[str, Any]]:
        """Megatron's forward(-backward) schedule over the micro-batches; ``loss_fn(mb, logits)`` runs
        on the last pipeline stage. Returns its dicts there ([] elsewhere)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from .model import causal_mask

        def forward_step(data: Any, chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
            mb = next(data)
            ids = mb.input_ids.to(self.device)
            b, s = ids.shape
            positions = torch.arange(s, device=self.device)[None].expand(b, s)
            return chunk(ids, positions, causal_mask(s, self.device)), partial(loss_fn, mb)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[model],
            num_microbatches=len(micro_batches),
            seq_length=max(int(mb.input_ids.shape[1]) for mb in micro_batches),
            micro_batch_size=micro_batches[0].size,
            forward_only=forward_only,
        )

    def _from_last_stage(self, obj: Any) -> Any:
        """Results exist on the last pipeline stage: hand them to the other stages."""
        if self.par.pp == 1:
            return obj
        from megatron.core import parallel_state as ps

        box = [obj]
        dist.broadcast_object_list(
            box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        return box[0]

    def _plan(self, size: int) -> list[list[slice]]:
        per_rank = self.spec.training.global_batch_size // self.par.dp
        mbs = self.spec.training.micro_batch_size
        if size % per_rank == 0 and per_rank % mbs == 0:
            return local_plan(size, per_rank, mbs)
        return [[slice(i, min(i + mbs, size)) for i in range(0, size, mbs)]]

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> LogProbs:
        """Log-probs, reference log-probs and entropy of this rank's rows, [B, T] on CPU, over exactly
        the micro-batches ``train`` uses (a first on-policy step then has ppo_kl == 0)."""
        mbs = [batch.select(rows) for step in self._plan(batch.size) for rows in step]

        def collect(
            mb: TrainBatch, logits: torch.Tensor, entropy: str | None
        ) -> tuple[torch.Tensor, dict[str, Any]]:
            logp, ent = self._token_stats(logits, mb, entropy)
            out = {"logp": pad_columns(logp.float().cpu(), batch.width)}
            if ent is not None:
                out["entropy"] = pad_columns(ent.float().cpu(), batch.width)
            return logits.new_zeros(()), out

        self.model.eval()
        try:
            policy = self._schedule(self.model, mbs, partial(_swap, collect, "metric"), forward_only=True)
            ref = None
            if self.ref_model is not None:
                ref = self._schedule(self.ref_model, mbs, partial(_swap, collect, None), forward_only=True)
        finally:
            self.model.train()
        policy, ref = self._from_last_stage((policy, ref))
        return LogProbs(
            logp=torch.cat([d["logp"] for d in policy]),
            ref_logp=None if ref is None else torch.cat([d["logp"] for d in ref]),
            entropy=torch.cat([d["entropy"] for d in policy]),
        )

    # ------------------------------------------------------------------------------- training

    def train(
        self,
        batch: TrainBatch,
        advantages: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        denominators: Sequence[float] | None = None,
        *,
        values: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
    ) -> Metrics:
        """This rank's share of a rollout: one optimizer step per global batch (see the torch backend's
        ``train``, whose contract this follows). Metrics are identical on every rank."""
        from megatron.core import parallel_state as ps

        algo = self.spec.algorithm
        plan = local_plan(
            batch.size,
            self.spec.training.global_batch_size // self.par.dp,
            self.spec.training.micro_batch_size,
        )
        advantages = check_per_token("advantages", advantages, batch)
        old_logp = check_per_token("old_logp", old_logp, batch)
        if ref_logp is not None:
            ref_logp = check_per_token("ref_logp", ref_logp, batch)
        elif algo.use_kl_loss:
            raise ValueError("algorithm.useKLLoss needs ref_logp (from logprobs())")
        if denominators is None:
            counts = torch.tensor(
                [_raw_count(batch.loss_mask[s[0].start : s[-1].stop], algo.loss_reduction) for s in plan],
                dtype=torch.float64,
                device=self.device,
            )
            dist.all_reduce(counts, group=ps.get_data_parallel_group())
            denominators = counts.clamp(min=1.0).tolist()
        totals: dict[str, float] = {}
        for step_slices, denominator in zip(plan, denominators, strict=True):
            metrics = self._optimizer_step(
                batch, step_slices, advantages, old_logp, ref_logp, float(denominator)
            )
            if not metrics["skipped_step"]:
                self.step += 1
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value
        return {key: value / len(plan) for key, value in totals.items()}

    def _optimizer_step(
        self,
        batch: TrainBatch,
        micro_batches: list[slice],
        advantages: torch.Tensor,
        old_logp: torch.Tensor,
        ref_logp: torch.Tensor | None,
        denominator: float,
    ) -> Metrics:
        from megatron.core import parallel_state as ps

        algo = self.spec.algorithm
        entropy = "grad" if algo.entropy_coef > 0 else "metric"
        # Megatron divides the returned loss by the micro-batch count and averages grads over DP ranks.
        scale = float(len(micro_batches) * self.par.dp)
        sums: dict[str, torch.Tensor] = {}

        def loss_fn(rows: slice, mb: TrainBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            logp, ent = self._token_stats(logits, mb, entropy)

            def cut(t: torch.Tensor | None) -> torch.Tensor | None:
                return None if t is None else t[rows, : mb.width].to(self.device)

            mask = mb.loss_mask.to(self.device)
            loss, metrics = policy_loss(
                algo,
                logp,
                cut(old_logp),  # type: ignore[arg-type]
                cut(advantages),  # type: ignore[arg-type]
                mask,
                entropy=ent,
                ref_logp=cut(ref_logp),
                rollout_logp=None if mb.rollout_logp is None else mb.rollout_logp.to(self.device),
                denominator=denominator,
            )
            _accumulate(sums, metrics, mask)
            return loss * scale, {}

        mbs = [batch.select(rows) for rows in micro_batches]
        row_iter = iter(micro_batches)
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self._schedule(
            self.model, mbs, lambda mb, logits: loss_fn(next(row_iter), mb, logits), forward_only=False
        )
        lr = lr_at(self.step, self.spec.training.optimizer, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        stepped, grad_norm, _ = self.optimizer.step()
        out = self._reduce_metrics(sums, ps.get_data_parallel_group())
        out.update(
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=lr,
            skipped_step=0.0 if stepped else 1.0,
        )
        return out

    def _reduce_metrics(self, sums: dict[str, torch.Tensor], group: Any) -> Metrics:
        """SUMMED_METRICS added over data-parallel ranks, the others token-weighted means (as the torch
        backend reports them); computed on the last stage, then shared."""
        out: Metrics = {}
        if sums:
            keys = sorted(k for k in sums if k != "_tokens")
            packed = torch.stack([sums[k] for k in keys] + [sums["_tokens"]]).to(self.device)
            dist.all_reduce(packed, group=group)
            tokens = max(float(packed[-1]), 1.0)
            for i, key in enumerate(keys):
                out[key] = float(packed[i]) if key in SUMMED_METRICS else float(packed[i]) / tokens
            out["tokens"] = float(packed[-1])
        return self._from_last_stage(out)

    # -------------------------------------------------------------------------------- weights

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The policy's weights under HF names (whole: gathered over TP and PP), CPU copies; tied
        models carry no lm_head.weight (as in their safetensors)."""
        from megatron.core import parallel_state as ps

        from .model import export_hf_weights

        stage = {
            k: v.to("cpu", copy=True) for k, v in export_hf_weights(self.model, self.shape, self.par).items()
        }
        if self.par.pp == 1:
            return stage
        stages: list[Any] = [None] * self.par.pp
        dist.all_gather_object(stages, stage, group=ps.get_pipeline_model_parallel_group())
        return {k: v for s in stages for k, v in s.items()}

    def save(self, path: str) -> None:
        raise NotImplementedError("megatron backend checkpoints (torch_dist) are not implemented yet")

    def load(self, path: str) -> None:
        raise NotImplementedError("megatron backend checkpoints (torch_dist) are not implemented yet")

    def shutdown(self) -> None:
        from megatron.core import parallel_state as ps

        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _swap(
    collect: Callable[[TrainBatch, torch.Tensor, str | None], Any],
    entropy: str | None,
    mb: TrainBatch,
    logits: torch.Tensor,
) -> Any:
    return collect(mb, logits, entropy)


def _accumulate(sums: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """One micro-batch's metrics: SUMMED_METRICS add up, the others are weighted by trained tokens."""
    n = mask.sum().double()
    sums["_tokens"] = sums.get("_tokens", torch.zeros((), dtype=torch.float64, device=n.device)) + n
    for key, value in metrics.items():
        value = value.detach().double()
        sums[key] = sums.get(key, 0.0) + (value if key in SUMMED_METRICS else value * n)


def _raw_count(loss_mask: torch.Tensor, reduction: str) -> float:
    if reduction == "token":
        return float(loss_mask.sum())
    return float((loss_mask.sum(-1) > 0).sum())
