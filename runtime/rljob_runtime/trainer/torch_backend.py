# long-file: one trainer rank: model, optimizer, data-parallel steps, checkpoints and weight export
"""The ``torch`` backend's rank: a transformers causal LM, AdamW and torch.distributed data parallel.

One ``TorchTrainerRank`` per trainer slot; ``TrainerGroup`` runs each as a Ray actor pinned to its
bundle (``ray.remote(TorchTrainerRank)``), and tests may use one in-process (world size 1, no
process group). Gradients are all-reduced by hand (SUM of a flat buffer) after a step's
micro-batches: every micro-batch loss is divided by the *global* batch's denominator, so the summed
gradients are exactly the global batch's gradient, whatever the data-parallel size.

On CPU: float32, gloo, one intra-op thread per rank. On CUDA: nccl, float32 master weights and
optimizer state with the forward under autocast in spec.model.dtype (bfloat16: no loss scaling is
done, so float16 may underflow; prefer bfloat16); log-probs are always computed in float32.

training.dynamicBatch packs a micro-batch's rows into one sequence without padding (``TrainBatch.packed``):
position ids restart at 0 per row and no attention mask is passed, from which transformers' masking
(``masking_utils.find_packed_sequence_indices``, transformers >= 4.56) builds the block-causal mask, so
no token attends across rows: log-probs and gradients are those of the padded computation.

advantageEstimator ppo adds a critic (``critic.py``): values before training (``logprobs``), then
after each policy optimizer step a critic step on the same micro-batches with the clipped value
loss, its own AdamW at algorithm.critic.lr, gradients all-reduced like the policy's.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from rljob_api.spec import RLTrainingJobSpec
from rljob_api.spec_training import OptimizerSpec

from ..algo.logprobs import entropy_from_logits, token_logprobs
from ..algo.losses import value_loss
from .base import LogProbs, Metrics, PackedInputs, Rows, TrainBatch, lr_at, place_rows
from .critic import CRITIC_DIR, critic_optimizer_spec, critic_path, load_value_model, token_values
from .offload import Group, grads, module_tensors, optimizer_tensors
from .rank_base import SUMMED_METRICS, TrainerRankBase, needs_reference, set_seed

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MODEL_DIR = "model"
STATE_FILE = "trainer_rank{rank}.pt"
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def actor_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment of a rank's process, set before torch is imported (Ray runtime_env env_vars):
    OpenMP threads sleep instead of spinning when idle (cores are shared with engines/other ranks).
    NCCL_CUMEM_ENABLE as SGLang's processes have it: SGLang sets 0 unless the environment says
    otherwise, and the two ends of one NCCL communicator (the weight-update group) must agree, or
    the engine's first receive fails with "unhandled cuda error ... invalid argument" (seen on two
    H200s, docs/BENCHMARKS.md, commit b9bac05)."""
    return {
        "OMP_WAIT_POLICY": "PASSIVE",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "NCCL_CUMEM_ENABLE": environ.get("NCCL_CUMEM_ENABLE", "0"),
    }


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TorchTrainerRank(TrainerRankBase):
    """One data-parallel rank of the torch backend (see the module docstring)."""

    def __init__(
        self,
        spec: RLTrainingJobSpec,
        model_path: str,
        rank: int = 0,
        world_size: int = 1,
        *,
        dist_timeout_s: float = 600.0,
        cpu_share: int = 1,
    ) -> None:
        from transformers import AutoModelForCausalLM

        super().__init__(
            spec, model_path, rank, world_size, dist_timeout_s=dist_timeout_s, cpu_share=cpu_share
        )
        # Ray exposes this rank's GPU as the only visible one: cuda:0.
        self.device = torch.device("cuda:0" if spec.resources.device == "cuda" else "cpu")
        # Parameters and optimizer state stay float32 (master weights); on CUDA the forward runs under
        # autocast in spec.model.dtype. On CPU everything is float32.
        self.compute_dtype: torch.dtype = torch.float32
        if self.device.type != "cpu":  # on cpu the base set the threads (cpu_share)
            torch.cuda.set_device(self.device)
            self.compute_dtype = getattr(torch, spec.model.dtype)
        set_seed(spec.training.seed)

        def load(dtype: torch.dtype) -> PreTrainedModel:
            model = AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=dtype, trust_remote_code=spec.model.trust_remote_code
            )
            model.config.use_cache = False
            return model.to(self.device)

        self.model = load(torch.float32)
        if spec.training.recompute_activations:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.ref_model: torch.nn.Module | None = None
        if needs_reference(spec):  # same dtype and autocast as the policy: equal log-probs at the start
            self.ref_model = load(torch.float32).eval().requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = _adamw(self.params, spec.training.optimizer)
        self.critic: PreTrainedModel | None = None
        self.critic_params: list[torch.nn.Parameter] = []
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.critic_opt = critic_optimizer_spec(spec)
        if spec.algorithm.advantage_estimator == "ppo":
            self._init_critic()
        self._logits_to_keep = "logits_to_keep" in _forward_params(self.model)

    def _init_critic(self) -> None:
        spec = self.spec
        critic = load_value_model(
            critic_path(spec, self.model_path), trust_remote_code=spec.model.trust_remote_code
        )
        self.critic = critic.to(self.device)
        if spec.training.recompute_activations:
            self.critic.gradient_checkpointing_enable()
        self.critic.train()
        self.critic_params = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_optimizer = _adamw(self.critic_params, self.critic_opt)

    @property
    def dp_size(self) -> int:
        return self.world_size  # data parallel only

    # ----------------------------------------------------------------------------- distributed

    def init_process_group(self, master_addr: str, master_port: int) -> None:
        """Join the group (all ranks at once); nothing to do with one rank."""
        if self.world_size == 1 or dist.is_initialized():
            return
        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.dist_timeout_s),
            device_id=self.device if self.device.type == "cuda" else None,
        )

    def _distributed(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """SUM over ranks of a small CPU tensor (through the device: nccl reduces CUDA tensors only)."""
        if not self._distributed():
            return tensor
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.cpu()

    def _all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        if not self._distributed():
            return
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for grad, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(reduced)

    def _sum_over_dp(self, counts: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(counts)

    # -------------------------------------------------------------------------------- forward

    def _forward(
        self, model: torch.nn.Module, batch: TrainBatch, entropy: str | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[b, T] log-probs of the response tokens under ``model`` (logits / temperature), and their
        entropy: ``entropy`` "grad" (differentiable), "metric" (no graph) or None (not computed)."""
        if self.packing:
            logits = self._packed_logits(model, batch.packed().to(self.device))
        else:
            logits = self._padded_logits(model, batch)
        valid = batch.response_mask().to(self.device) > 0  # 0 past each response: no stray values there
        logp = token_logprobs(logits, batch.response_ids.to(self.device), self.temperature)
        logp = torch.where(valid, logp, 0.0)
        ent = None
        if entropy == "grad":
            ent = torch.where(valid, entropy_from_logits(logits, self.temperature), 0.0)
        elif entropy == "metric":
            with torch.no_grad():
                ent = torch.where(valid, entropy_from_logits(logits.detach(), self.temperature), 0.0)
        return logp, ent

    def _padded_logits(self, model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
        """[b, T, V] logits predicting the response tokens, from the right-padded rows."""
        positions = batch.logit_positions().to(self.device)
        first = int(batch.prompt_lengths.min()) - 1
        kwargs: dict[str, Any] = {}
        if self._logits_to_keep:  # skip the LM head on the prompt-only prefix
            kwargs["logits_to_keep"] = batch.input_ids.shape[1] - first
        else:
            first = 0
        with self._autocast():
            out = model(
                input_ids=batch.input_ids.to(self.device),
                attention_mask=batch.attention_mask.to(self.device),
                use_cache=False,
                **kwargs,
            )
        rows = torch.arange(batch.size, device=self.device)[:, None]
        return out.logits[rows, positions - first]

    def _packed_logits(self, model: torch.nn.Module, packed: PackedInputs) -> torch.Tensor:
        """[b, T, V] logits predicting the response tokens, from the rows packed end to end. No
        attention mask: transformers then reads the row boundaries from the restarting position ids
        (a mask would switch that detection off)."""
        kwargs: dict[str, Any] = {}
        index = packed.logit_index
        if self._logits_to_keep:  # the LM head only where a response token is predicted
            keep, index = torch.unique(packed.logit_index, return_inverse=True)
            kwargs["logits_to_keep"] = keep
        with self._autocast():
            out = model(
                input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, **kwargs
            )
        return out.logits[0, index]

    def _values(self, batch: TrainBatch) -> torch.Tensor:
        """[b, T] float32 critic values before each response token; 0 past each response."""
        assert self.critic is not None
        with self._autocast():
            if self.packing:
                packed = batch.packed().to(self.device)
                inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
                flat = token_values(self.critic, inputs, packed.logit_index.reshape(1, -1))
                values = flat.reshape(packed.logit_index.shape)
            else:
                inputs = {
                    "input_ids": batch.input_ids.to(self.device),
                    "attention_mask": batch.attention_mask.to(self.device),
                }
                values = token_values(self.critic, inputs, batch.logit_positions().to(self.device))
        return torch.where(batch.response_mask().to(self.device) > 0, values, 0.0)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> LogProbs:
        """Log-probs, reference log-probs and entropy of this rank's rows, [B, T] on CPU.

        Uses exactly the micro-batches ``train`` will use, so that the first step is bit-for-bit
        on-policy (ppo_kl == 0).
        """
        self._require_resident("logprobs")
        self.model.eval()
        if self.critic is not None:
            self.critic.eval()
        logp: list[tuple[Rows, torch.Tensor]] = []
        ref: list[tuple[Rows, torch.Tensor]] = []
        ent: list[tuple[Rows, torch.Tensor]] = []
        values: list[tuple[Rows, torch.Tensor]] = []
        try:
            for step in self._plan(batch):
                for rows in step:
                    mb = batch.select(rows)
                    lp, e = self._forward(self.model, mb, entropy="metric")
                    logp.append((rows, lp))
                    assert e is not None  # entropy="metric" computes it
                    ent.append((rows, e))
                    if self.ref_model is not None:
                        ref.append((rows, self._forward(self.ref_model, mb, entropy=None)[0]))
                    if self.critic is not None:
                        values.append((rows, self._values(mb)))
        finally:
            self.model.train()
            if self.critic is not None:
                self.critic.train()

        def place(parts: list[tuple[Rows, torch.Tensor]]) -> torch.Tensor:
            return place_rows(parts, batch.size, batch.width)

        return LogProbs(
            place(logp),
            place(ref) if ref else None,
            place(ent),
            place(values) if values else None,
        )

    # ------------------------------------------------------------------------------- training

    def _optimizer_step(
        self,
        batch: TrainBatch,
        micro_batches: list[Rows],
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        denominator: float,
    ) -> Metrics:
        algo = self.spec.algorithm
        want_entropy_grad = algo.entropy_coef > 0
        self.optimizer.zero_grad(set_to_none=True)
        sums = _MetricSums()
        for rows in micro_batches:
            mb = batch.select(rows)
            logp, entropy = self._forward(self.model, mb, entropy="grad" if want_entropy_grad else "metric")
            loss, metrics, mask = self._micro_batch_loss(
                mb, rows, logp, entropy, advantages, old_logp, ref_logp, denominator
            )
            loss.backward()
            sums.add(metrics, mask)
        grad_norm, lr, finite = self._update(self.params, self.optimizer, self.spec.training.optimizer)
        out = self._reduce_metrics(sums)
        out.update(grad_norm=grad_norm, lr=lr, skipped_step=0.0 if finite else 1.0)
        return out

    def _critic_step(
        self,
        batch: TrainBatch,
        micro_batches: list[Rows],
        old_values: torch.Tensor,
        returns: torch.Tensor,
        denominator: float,
    ) -> Metrics:
        """One critic optimizer step (clipped value loss) over the policy step's micro-batches."""
        assert self.critic is not None and self.critic_optimizer is not None
        algo = self.spec.algorithm
        self.critic_optimizer.zero_grad(set_to_none=True)
        sums = _MetricSums()
        for rows in micro_batches:
            mb = batch.select(rows)
            mask = mb.loss_mask.to(self.device)
            loss, metrics = value_loss(
                self._values(mb),
                old_values[rows, : mb.width].to(self.device),
                returns[rows, : mb.width].to(self.device),
                mask,
                algo.critic.value_clip,
                algo.loss_reduction,
                denominator,
            )
            loss.backward()
            sums.add(metrics, mask)
        grad_norm, lr, finite = self._update(self.critic_params, self.critic_optimizer, self.critic_opt)
        out = self._reduce_metrics(sums)
        del out["tokens"]  # the policy step reports them
        out.update(critic_grad_norm=grad_norm, critic_lr=lr, critic_skipped_step=0.0 if finite else 1.0)
        return out

    def _update(
        self, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, opt: OptimizerSpec
    ) -> tuple[float, float, bool]:
        """All-reduce, clip, set the lr of optimizer step ``self.step`` and step (skipped on inf/nan
        gradients, as Megatron does). Returns (grad norm, lr, whether it stepped)."""
        self._all_reduce_grads(params)
        clip = self.spec.training.optimizer.clip_grad
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        lr = lr_at(self.step, opt, self.total_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(grad_norm), lr, finite

    def _reduce_metrics(self, sums: _MetricSums) -> Metrics:
        """One step's metrics over every rank (one all-reduce): SUMMED_METRICS added up, the others
        token-weighted means; ``tokens`` is the step's trained-token count."""
        s_keys, w_keys = sorted(sums.summed), sorted(sums.weighted)
        packed = torch.stack(
            [*(sums.summed[k] for k in s_keys), *(sums.weighted[k] for k in w_keys), sums.tokens]
        )
        packed = self._all_reduce(packed)
        total_tokens = max(float(packed[-1]), 1.0)
        out: Metrics = {k: float(packed[i]) for i, k in enumerate(s_keys)}
        out.update({k: float(packed[len(s_keys) + i]) / total_tokens for i, k in enumerate(w_keys)})
        out["tokens"] = float(packed[-1])
        return out

    # -------------------------------------------------------------------------------- weights

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The policy's state_dict under Hugging Face names (tied aliases included), detached CPU copies."""
        with self.weights_resident():
            return {name: t.detach().to("cpu", copy=True) for name, t in self.model.state_dict().items()}

    def _offload_groups(self) -> dict[str, Group]:
        """What leaves the GPU in a colocated job's engine turn (``offload.Offloadable``)."""
        return {
            "weights": Group(lambda: module_tensors(self.model)),
            "grads": Group(lambda: grads(self.model, self.critic), keep=False),
            "training": Group(
                lambda: [
                    *optimizer_tensors(self.optimizer, self.critic_optimizer),
                    *module_tensors(self.ref_model, self.critic),
                ]
            ),
        }

    def device_weights(self) -> dict[str, torch.Tensor]:
        """The policy on its device under HF names (rank 0 sends; every rank holds the same)."""
        return dict(self.model.state_dict()) if self.rank == 0 else {}

    def save(self, path: str) -> None:
        """``path/model``: HF safetensors + config + tokenizer files (rank 0); ``path/trainer_rank{r}.pt``:
        optimizer, schedule position and RNG state of every rank.

        A collective: every rank calls it. When any rank's write fails (disk full, I/O error), every
        rank raises ``CheckpointWriteError`` (checkpoint/agree.py) instead of the others waiting in a
        barrier for the one that raised."""
        from ..checkpoint.agree import failures_by_all_reduce, write_agreed

        self._require_resident("save")  # same on every rank (a driver bug), before any collective
        root = Path(path)
        tmp = root / (STATE_FILE.format(rank=self.rank) + ".tmp")

        def write() -> None:
            root.mkdir(parents=True, exist_ok=True)
            if self.rank == 0:
                model_dir = root / MODEL_DIR
                self.model.save_pretrained(model_dir, safe_serialization=True)
                _copy_side_files(Path(self.model_path), model_dir)
                if self.critic is not None:
                    self.critic.save_pretrained(root / CRITIC_DIR, safe_serialization=True)
            state = {
                "step": self.step,
                "world_size": self.world_size,
                "optimizer": self.optimizer.state_dict(),
                "rng": rng_state(),
            }
            if self.critic_optimizer is not None:
                state["critic_optimizer"] = self.critic_optimizer.state_dict()
            try:
                torch.save(state, tmp)
                os.replace(tmp, root / STATE_FILE.format(rank=self.rank))
            except BaseException:
                with contextlib.suppress(OSError):  # don't leave a partial file (a full disk)
                    tmp.unlink(missing_ok=True)
                raise

        # The agreement's all-reduce is also the barrier that followed the writes.
        write_agreed(
            write, failures_by_all_reduce(self._all_reduce, self.rank, self.world_size), rank=self.rank
        )

    def load(self, path: str) -> None:
        """Restore ``save``'s checkpoint (same data-parallel size)."""
        self._require_resident("load")
        root = Path(path)
        _load_weights(self.model, root / MODEL_DIR)
        state = torch.load(root / STATE_FILE.format(rank=self.rank), map_location="cpu", weights_only=False)
        if state["world_size"] != self.world_size:
            raise ValueError(
                f"checkpoint {root} was saved by {state['world_size']} data-parallel ranks, not {self.world_size}"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None and self.critic_optimizer is not None:
            if "critic_optimizer" not in state:
                raise ValueError(
                    f"checkpoint {root} has no critic (saved by a run without advantageEstimator ppo)"
                )
            _load_weights(self.critic, root / CRITIC_DIR)
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.step = int(state["step"])
        set_rng_state(state["rng"])


class _MetricSums:
    """One rank's per-micro-batch metrics of one optimizer step, before the all-reduce: metrics in
    SUMMED_METRICS add up (they are divided by the global denominator), the others are weighted by
    the micro-batch's trained tokens."""

    def __init__(self) -> None:
        self.summed: dict[str, torch.Tensor] = {}
        self.weighted: dict[str, torch.Tensor] = {}
        self.tokens = torch.zeros((), dtype=torch.float64)

    def add(self, metrics: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        n = mask.sum().double().cpu()
        self.tokens += n
        for key, value in metrics.items():
            value = value.detach().double().cpu()
            if key in SUMMED_METRICS:
                self.summed[key] = self.summed.get(key, 0.0) + value
            else:
                self.weighted[key] = self.weighted.get(key, 0.0) + value * n


def _adamw(params: list[torch.nn.Parameter], opt: OptimizerSpec) -> torch.optim.Optimizer:
    """AdamW with the spec's settings; as Megatron, no weight decay on biases and norm weights (1-D)."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": opt.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(
        groups, lr=lr_at(0, opt, 1), betas=(opt.adam_beta1, opt.adam_beta2), eps=opt.adam_eps
    )


def _load_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy the safetensors weights under ``directory`` into ``model`` (parameters and buffers)."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights under {directory}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    named = dict(model.named_parameters())
    missing = sorted(set(named) - set(weights))
    if missing:
        raise ValueError(f"checkpoint {directory} lacks parameters: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, param in named.items():
            param.copy_(weights[name].to(device=param.device, dtype=param.dtype))
        buffers = dict(model.named_buffers())
        for name, tensor in weights.items():
            if name in buffers:
                buffers[name].copy_(tensor.to(buffers[name].device, buffers[name].dtype))


def _forward_params(model: torch.nn.Module) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def _copy_side_files(src: Path, dest: Path) -> None:
    """Tokenizer and generation files of the original model, so the checkpoint is a full HF directory."""
    if not src.is_dir():
        return
    for item in src.iterdir():
        if not item.is_file() or item.name.endswith(WEIGHT_FILES) or item.name in WEIGHT_INDEXES:
            continue
        if not (dest / item.name).exists():
            shutil.copy2(item, dest / item.name)
