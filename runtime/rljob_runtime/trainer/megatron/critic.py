"""The critic (value model) of advantageEstimator ppo for the megatron backend.

As the torch backend's (``trainer/critic.py``): the base transformer of ``algorithm.critic.path``
(default ``model.path``) with a scalar head per token, the value V at the position before each
response token (the state the token is generated from), trained with the clipped value loss by its
own Adam at ``algorithm.critic.lr``.

Here the transformer is a Megatron GPTModel of the critic checkpoint's shape at the policy's layout
(TP x PP x DP), its output layer made the identity (``lm_head.return_hidden_states``: the final
hidden states, after the final norm) and a ``value_head`` (``torch.nn.Linear(hidden, 1)``, the
weights and bias of transformers' ``...ForTokenClassification`` "score" layer) on the last pipeline
stage. The head is replicated over TP (its input, the final hidden states, is whole on every TP rank),
so Megatron DDP treats it like any replicated parameter. It starts at zero when the critic checkpoint
has no ``score.*`` tensors (a causal-LM checkpoint: every rank starts alike and the first values are
0), else from them.

The unused output layer of an untied model stays (its weight gets no gradient; kept so the module is
the policy's GPTModel and loads its HF weights the same way). Checkpoints: the critic's model and
optimizer are a second Megatron distributed checkpoint (``<iteration>/critic/``) beside the policy's.

An MoE policy at expert parallel size > 1 (``critic_layout``): a dense critic (algorithm.critic.path)
runs at expert parallel size 1 (megatron-core's expert groups are process-wide and a model without
experts never uses them); an MoE critic (by default, the policy's model) at the policy's, its
micro-batches evened out for the token dispatcher as the policy's (``expert_parallel.dispatchable``).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_api.spec_training import OptimizerSpec

from ...algo.losses import value_loss
from ..base import Metrics, TrainBatch
from ..critic import critic_optimizer_spec, critic_path
from ..offload import optimizer_tensors
from .arch import ModelShape, model_shape
from .expert_parallel import dispatchable
from .parallel import Parallelism
from .policy import ModelOptions, build_policy, ddp_grad_tensors, ddp_weight_tensors
from .schedule import accumulate, from_last_stage, reduce_metrics, run_schedule

Rows = slice | list[int]

VALUE_HEAD = "value_head"  # the GPTModel attribute that holds the head
HF_HEAD = ("score.weight", "score.bias")  # transformers' token-classification head


def attach_value_head(gpt_model: Any, hf_state: Mapping[str, torch.Tensor] | None = None) -> None:
    """Make ``gpt_model`` return per-token values [b, s] (float32) instead of logits, through a
    ``value_head`` added on its last pipeline stage (``post_process``); earlier stages are unchanged
    (they return hidden states to the next stage anyway). The head takes ``score.weight`` [1, h] and
    ``score.bias`` [1] from ``hf_state`` when both are there, else zeros. Call before DDP wraps the
    model, so its parameters are in DDP's buffers."""
    from .lm_head import return_hidden_states

    if not gpt_model.post_process:
        return
    return_hidden_states(gpt_model)
    config = gpt_model.config
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    head = torch.nn.Linear(config.hidden_size, 1, dtype=config.params_dtype, device=device)
    # Each head parameter takes the dtype of its optimizer group, so no group mixes fp32 and bf16
    # (which megatron-core 0.16's distributed optimizer mis-maps: optimizer_groups.py, applied to every
    # build too): the weight (2-D, weight decay) the linears', the bias (1-D, no weight decay) the
    # norms' (fp32: megatron-core's local norms and the "norm" fusion keep fp32 weights in a bf16 model).
    norm = getattr(getattr(gpt_model.decoder, "final_layernorm", None), "weight", None)
    if norm is not None and norm.dtype != head.bias.dtype:
        head.bias = torch.nn.Parameter(head.bias.detach().to(norm.dtype))
    weight, bias = (hf_state or {}).get(HF_HEAD[0]), (hf_state or {}).get(HF_HEAD[1])
    with torch.no_grad():
        if weight is not None and bias is not None:
            if tuple(weight.shape) != (1, config.hidden_size) or tuple(bias.shape) != (1,):
                raise ValueError(
                    f"algorithm.critic: the value head score.weight {tuple(weight.shape)} / score.bias "
                    f"{tuple(bias.shape)} does not fit hidden size {config.hidden_size} (expected (1, "
                    f"{config.hidden_size}) / (1,))"
                )
            head.weight.copy_(weight)
            head.bias.copy_(bias.to(head.bias.dtype))
        else:
            head.weight.zero_()
            head.bias.zero_()
    gpt_model.add_module(VALUE_HEAD, head)
    forward = gpt_model.forward

    def values_forward(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        hidden = forward(*args, **kwargs)  # [b, s, h]: the identity output layer's, transposed back
        head = getattr(self, VALUE_HEAD)
        # the weight's GEMM in its dtype, the bias (maybe fp32: above) added in fp32
        return torch.nn.functional.linear(hidden, head.weight).squeeze(-1).float() + head.bias.float()

    gpt_model.forward = types.MethodType(values_forward, gpt_model)


def response_values(values: torch.Tensor, mb: TrainBatch, *, packed: bool = False) -> torch.Tensor:
    """[b, T] values before each response token, 0 past each response, from the model's per-position
    values: [b, s] of the padded rows, or [1, N] of the rows packed end to end."""
    device = values.device
    valid = mb.response_mask().to(device) > 0
    if packed:
        picked = values[0, mb.packed_logit_index().to(device)[valid]]
    else:
        rows = torch.arange(mb.size, device=device)[:, None].expand_as(valid)
        picked = values[rows[valid], mb.logit_positions().to(device)[valid]]
    return torch.zeros(valid.shape, dtype=picked.dtype, device=device).masked_scatter(valid, picked)


def critic_weights(path: str, shape: Any) -> dict[str, torch.Tensor]:
    """The critic checkpoint's HF tensors; an untied model without ``lm_head.weight`` (a value model
    saved by transformers, ``...ForTokenClassification``) gets a zero one: the critic never reads its
    output layer, but the GPTModel has it."""
    from .checkpoint import read_hf_state

    hf = read_hf_state(path)
    if not shape.tied_embeddings and "lm_head.weight" not in hf:
        embed = hf["model.embed_tokens.weight"]
        hf["lm_head.weight"] = torch.zeros_like(embed)
    return hf


def critic_layout(
    spec: RLTrainingJobSpec, config: Mapping[str, Any], gpus: int
) -> tuple[ModelShape, Parallelism]:
    """The critic's shape (from its HF ``config``) and layout on ``gpus``: the policy's, except that
    a dense critic runs at expert parallel size 1 (training.parallelism.expert splits an MoE model's
    experts; a dense one has none to split). ValueError naming the numbers when it does not fit."""
    from .checks import check_layout

    if model_shape(config).moe is None and spec.training.parallelism.expert > 1:
        par_spec = spec.training.parallelism.model_copy(update={"expert": 1})
        training = spec.training.model_copy(update={"parallelism": par_spec})
        spec = spec.model_copy(update={"training": training})
    return check_layout(spec, config, gpus=gpus)


@dataclass
class MegatronCritic:
    """The value model of one megatron rank: GPTModel + value head under Megatron DDP, its own Adam
    (algorithm.critic.lr, the policy's other optimizer settings and schedule) and, with
    training.offloadOptimizer, its own streamed optimizer state."""

    model: Any
    optimizer: Any
    offload: Any
    opt: OptimizerSpec
    par: Parallelism
    device: torch.device

    @classmethod
    def build(
        cls,
        spec: RLTrainingJobSpec,
        options: ModelOptions,
        par: Parallelism,
        *,
        model_path: str,
        dtype: torch.dtype,
        device: torch.device,
        distributed_optimizer: bool = True,
    ) -> MegatronCritic:
        """The critic from ``algorithm.critic.path`` (default: the policy's ``model_path``) at the
        policy's layout ``par`` (``critic_layout``: a dense critic at expert parallel size 1; a critic
        checkpoint whose sizes do not divide it is refused by name), with the policy's fusions and
        recompute, its full output layer unused (no chunked head)."""
        from .checks import read_hf_config
        from .model import load_hf_weights

        path = critic_path(spec, model_path)
        try:
            shape, par = critic_layout(spec, read_hf_config(path), par.world_size)
        except ValueError as exc:
            raise ValueError(f"algorithm.critic ({path}): {exc}") from exc
        hf = critic_weights(path, shape)

        def initial(model: torch.nn.Module) -> None:
            load_hf_weights(model, hf, shape, par)  # before the head: the names must match exactly
            attach_value_head(model, hf)

        opt = critic_optimizer_spec(spec)
        training = spec.training.model_copy(update={"optimizer": opt})
        built = build_policy(
            spec.model_copy(update={"training": training}),
            replace(options, chunked_head=False),
            shape,
            par,
            dtype=dtype,
            device=device,
            initial=initial,
            distributed_optimizer=distributed_optimizer,
        )
        return cls(built.model, built.optimizer, built.offload, opt, par, device)

    def values(self, mbs: Sequence[TrainBatch], width: int, *, packed: bool) -> list[torch.Tensor]:
        """Per micro-batch, [b, width] float32 values on CPU (every pipeline stage gets them)."""
        from ..base import pad_columns

        def collect(mb: TrainBatch, out: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            values = response_values(out, mb, packed=packed)
            return out.new_zeros(()), {"values": pad_columns(values.float().cpu(), width)}

        self.model.eval()
        try:
            with torch.no_grad():
                results = run_schedule(
                    self.model, list(mbs), collect, forward_only=True, device=self.device, packed=packed
                )
        finally:
            self.model.train()
        return [d["values"] for d in from_last_stage(results, self.par.pp)]

    def step(
        self,
        batch: TrainBatch,
        rows: Sequence[Rows],
        old_values: torch.Tensor,
        returns: torch.Tensor,
        *,
        value_clip: float,
        reduction: Any,
        denominator: float,
        lr: float,
        packed: bool,
    ) -> Metrics:
        """One critic optimizer step (the clipped value loss) over the policy step's micro-batches
        (rows ``rows`` of ``batch``, ``old_values`` and ``returns``); its metrics as the torch backend's
        critic reports them: value_loss, value_clipfrac, value_mean, critic_grad_norm, critic_lr,
        critic_skipped_step."""
        from megatron.core import parallel_state as ps

        mbs = dispatchable([batch.select(r) for r in rows], self.model.config, self.par.ep)
        scale = float(len(mbs) * self.par.dp)  # what Megatron divides the returned loss by (as the policy's)
        sums: dict[str, torch.Tensor] = {}
        row_iter = iter(rows)

        def loss_fn(mb: TrainBatch, out: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            r = next(row_iter)
            mask = mb.loss_mask.to(self.device)
            loss, metrics = value_loss(
                response_values(out, mb, packed=packed),
                old_values[r, : mb.width].to(self.device),
                returns[r, : mb.width].to(self.device),
                mask,
                value_clip,
                reduction,
                denominator,
            )
            accumulate(sums, metrics, mask)
            return loss * scale, {}

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        run_schedule(self.model, mbs, loss_fn, forward_only=False, device=self.device, packed=packed)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        stepped, grad_norm, _ = self.optimizer.step()
        out = reduce_metrics(sums, ps.get_data_parallel_group(), self.par.pp)
        out.pop("tokens", None)  # the policy's step reports them
        out.update(
            critic_grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            critic_lr=lr,
            critic_skipped_step=0.0 if stepped else 1.0,
        )
        return out

    # ------------------------------------------------------------------ offload and checkpoints

    def weight_tensors(self) -> list[torch.Tensor]:
        return ddp_weight_tensors(self.model)

    def grad_tensors(self) -> list[torch.Tensor | None]:
        return ddp_grad_tensors(self.model)

    def optimizer_tensors(self) -> list[torch.Tensor]:
        return list(optimizer_tensors(self.optimizer))

    def state_resident(self) -> contextlib.AbstractContextManager[Any]:
        return self.offload.resident() if self.offload is not None else contextlib.nullcontext()

    def save(self, directory: str) -> None:
        """Model and optimizer as their own Megatron distributed checkpoint (any layout loads it): a
        collective of every rank, as the policy's save."""
        from . import dist_checkpoint as dcp

        with self.state_resident():
            dcp.save_trainer_state(directory, self.model, self.optimizer, {})

    def load(self, directory: str) -> None:
        from . import dist_checkpoint as dcp

        with self.state_resident():
            dcp.load_trainer_state(directory, self.model, self.optimizer)
