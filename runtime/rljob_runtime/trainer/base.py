# long-file: the backends' common contract: the padded batch layout, its builders and the loss
"""What every trainer backend (torch, megatron) offers the driver, and the padded batch it trains on.

Layout of a batch (``TrainBatch``), built from Samples:

- ``input_ids`` [B, L]: prompt + response token ids of each sample, right-padded; ``attention_mask``
  marks the real tokens. Right padding keeps every real token at its natural position 0..n-1.
- per-token tensors (``response_ids``, ``loss_mask``, ``rollout_logp``, and everything a backend
  returns or takes per token: log-probs, entropy, advantages) are [B, T] over response tokens only:
  column j is response token j of the sample, padded on the right; T = the longest response.
- alignment: response token j of sample i sits at ``input_ids[i, P_i + j]`` (P_i = prompt length)
  and its log-prob comes from the logits at position ``P_i + j - 1`` (the position that predicts
  it); ``logit_positions()`` gives those positions.
- packed (``training.dynamicBatch``): ``TrainBatch.packed()`` lays a micro-batch's rows end to end
  without padding, ``input_ids`` [1, N] (N = the sum of the rows' prompt + response lengths) with
  positions restarting at 0 per row and ``cu_seqlens`` marking the rows' boundaries (attention never
  crosses one); ``logit_index`` [b, T] is ``logit_positions()`` moved to each row's offset, so the
  per-token tensors keep the [b, T] layout above.

Sign conventions follow ``rljob_runtime.algo.losses``: losses are minimised; a positive advantage
raises the log-prob of its tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from rljob_api.spec_training import OptimizerSpec

from ..algo.masked import Reduction
from ..sync.base import WeightSender

if TYPE_CHECKING:
    from ..data.sample import Sample

Metrics = dict[str, float]
# A micro-batch: rows of the batch it cuts, a slice (microBatchSize) or row indices (dynamicBatch's
# token-budget micro-batches, not necessarily contiguous).
Rows = slice | list[int]


# ----------------------------------------------------------------------------------------- batches


@dataclass
class TrainBatch:
    """Padded tensors of a list of samples (see the module docstring for the layout)."""

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long
    prompt_lengths: torch.Tensor  # [B] long
    response_lengths: torch.Tensor  # [B] long
    response_ids: torch.Tensor  # [B, T] long, 0 past each response
    loss_mask: torch.Tensor  # [B, T] float32, 0 past each response
    rollout_logp: torch.Tensor | None = None  # [B, T] float32, when every sample carries them
    # training.routingReplay: per row, SGLang's routing record (``engine_api.routed_experts``; decoded
    # by the rank that replays it, a micro-batch at a time); when every sample carries one
    routed_experts: list[str] | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def width(self) -> int:
        """T, the per-token tensors' width."""
        return int(self.response_ids.shape[1])

    def logit_positions(self) -> torch.Tensor:
        """[B, T] long: the position whose logits predict response token j (P_i + j - 1); padding
        columns repeat the sample's last valid position so gathers stay in range."""
        cols = torch.arange(self.width, dtype=torch.long)[None, :]
        last = (self.response_lengths - 1).clamp(min=0)[:, None]
        return self.prompt_lengths[:, None] - 1 + torch.minimum(cols, last)

    def response_mask(self) -> torch.Tensor:
        """[B, T] float32: 1 on every response token (trained or not), 0 on padding."""
        cols = torch.arange(self.width, dtype=torch.long)[None, :]
        return (cols < self.response_lengths[:, None]).float()

    def select(self, rows: slice | Sequence[int]) -> TrainBatch:
        """The rows ``rows`` as a batch of their own, trimmed to their longest sequence and response."""
        index = _row_index(rows, self.size)
        if not index:
            raise ValueError("TrainBatch.select: no rows")
        idx = torch.tensor(index, dtype=torch.long)
        resp = self.response_lengths[idx]
        seq = self.prompt_lengths[idx] + resp
        length, width = int(seq.max()), max(int(resp.max()), 1)
        return TrainBatch(
            input_ids=self.input_ids[idx, :length],
            attention_mask=self.attention_mask[idx, :length],
            prompt_lengths=self.prompt_lengths[idx],
            response_lengths=resp,
            response_ids=self.response_ids[idx, :width],
            loss_mask=self.loss_mask[idx, :width],
            rollout_logp=None if self.rollout_logp is None else self.rollout_logp[idx, :width],
            routed_experts=None if self.routed_experts is None else [self.routed_experts[i] for i in index],
        )

    def sequence_lengths(self) -> list[int]:
        """Prompt + response tokens of each row (what a packed micro-batch spends of its budget)."""
        return [int(n) for n in self.prompt_lengths + self.response_lengths]

    def packed(self) -> PackedInputs:
        """The rows end to end without padding (the module docstring's packed layout)."""
        lengths = self.prompt_lengths + self.response_lengths
        ids = [self.input_ids[i, : int(n)] for i, n in enumerate(lengths)]
        positions = [torch.arange(int(n), dtype=torch.long) for n in lengths]
        cu = torch.zeros(self.size + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lengths, 0)
        return PackedInputs(
            input_ids=torch.cat(ids)[None],
            position_ids=torch.cat(positions)[None],
            cu_seqlens=cu,
            max_seqlen=int(lengths.max()),
            logit_index=self.packed_logit_index(),
        )

    def packed_logit_index(self) -> torch.Tensor:
        """[b, T] long: ``logit_positions()`` in the packed sequence (each row moved to its offset)."""
        lengths = self.prompt_lengths + self.response_lengths
        return (torch.cumsum(lengths, 0) - lengths)[:, None] + self.logit_positions()

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch's tensors on ``device`` (a routing record list stays where it is: the rank moves
        each micro-batch's replay targets itself)."""
        moved: dict[str, Any] = {
            name: (value.to(device) if isinstance(value, torch.Tensor) else value)
            for name, value in self.__dict__.items()
        }
        return replace(self, **moved)


@dataclass
class PackedInputs:
    """A micro-batch packed into one sequence (``TrainBatch.packed``)."""

    input_ids: torch.Tensor  # [1, N] long
    position_ids: torch.Tensor  # [1, N] long, 0..n_i-1 per row
    cu_seqlens: torch.Tensor  # [b + 1] int32: row i is tokens cu_seqlens[i]:cu_seqlens[i+1]
    max_seqlen: int  # the longest row
    logit_index: torch.Tensor  # [b, T] long: index along N of the logits predicting response token j

    def to(self, device: torch.device | str) -> PackedInputs:
        return PackedInputs(
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            cu_seqlens=self.cu_seqlens.to(device),
            max_seqlen=self.max_seqlen,
            logit_index=self.logit_index.to(device),
        )


def _row_index(rows: slice | Sequence[int], size: int) -> list[int]:
    if isinstance(rows, slice):
        return list(range(size))[rows]
    return [int(r) for r in rows]


def pad_per_token(
    values: Sequence[Sequence[float]], width: int | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Ragged per-token lists -> [B, width] right-padded with 0 (width defaults to the longest, >= 1)."""
    longest = max((len(v) for v in values), default=0)
    width = max(longest, 1) if width is None else width
    if width < longest:
        raise ValueError(f"pad_per_token: width {width} is shorter than the longest row ({longest})")
    out = torch.zeros((len(values), width), dtype=dtype)
    for row, value in enumerate(values):
        if len(value):
            out[row, : len(value)] = torch.as_tensor(value, dtype=dtype)
    return out


def unpad_per_token(tensor: torch.Tensor, lengths: Sequence[int]) -> list[list[float]]:
    """[B, T] -> ragged Python lists, row i cut to lengths[i]."""
    return [tensor[i, : int(n)].tolist() for i, n in enumerate(lengths)]


def pad_columns(tensor: torch.Tensor, width: int, value: float = 0.0) -> torch.Tensor:
    """[B, T] -> [B, width]: trim or right-pad the columns."""
    if tensor.shape[1] >= width:
        return tensor[:, :width]
    pad = tensor.new_full((tensor.shape[0], width - tensor.shape[1]), value)
    return torch.cat([tensor, pad], dim=1)


def build_batch(samples: Sequence[Sample], pad_token_id: int = 0) -> TrainBatch:
    """Pad the samples' prompt+response ids, loss masks (``effective_loss_mask``) and rollout log-probs.

    Every sample needs a non-empty prompt (the first response token is predicted from the last
    prompt token). ``rollout_logp`` is set only when every sample carries rollout log-probs, and
    ``routed_experts`` only when every sample carries a routing record.
    """
    if not samples:
        raise ValueError("build_batch: no samples")
    seqs, masks, logps = [], [], []
    for i, sample in enumerate(samples):
        if not sample.prompt_ids:
            raise ValueError(f"build_batch: sample {i} has no prompt tokens")
        n = len(sample.response_ids)
        mask = sample.effective_loss_mask()
        if len(mask) != n:
            raise ValueError(
                f"build_batch: sample {i} has {n} response tokens but a loss mask of {len(mask)}"
            )
        if sample.rollout_logprobs is not None and len(sample.rollout_logprobs) != n:
            raise ValueError(
                f"build_batch: sample {i} has {n} response tokens but {len(sample.rollout_logprobs)} "
                "rollout log-probs"
            )
        seqs.append(sample.tokens)
        masks.append(mask)
        logps.append(sample.rollout_logprobs)
    lengths = [len(s) for s in seqs]
    input_ids = torch.full((len(seqs), max(lengths)), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, seq in enumerate(seqs):
        input_ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        attention_mask[row, : len(seq)] = 1
    responses = [s.response_ids for s in samples]
    width = max(max(len(r) for r in responses), 1)
    given = [lp for lp in logps if lp is not None]
    records = [s.rollout_routed_experts for s in samples]
    routed = [str(r) for r in records] if all(r is not None for r in records) else None
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_lengths=torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
        response_lengths=torch.tensor([len(r) for r in responses], dtype=torch.long),
        response_ids=pad_per_token(responses, width, dtype=torch.long),
        loss_mask=pad_per_token(masks, width),
        rollout_logp=pad_per_token(given, width) if len(given) == len(logps) else None,
        routed_experts=routed,
    )


def loss_count(loss_mask: torch.Tensor, reduction: Reduction) -> float:
    """What ``reduce_loss`` divides by, counted over ``loss_mask`` (one rank's share may be 0):
    trained tokens (token reduction) or samples with at least one trained token (sample)."""
    if reduction == "token":
        return float(loss_mask.sum())
    if reduction == "sample":
        return float((loss_mask.sum(-1) > 0).sum())
    raise ValueError(f"unknown loss reduction {reduction!r}")


def loss_denominator(loss_mask: torch.Tensor, reduction: Reduction) -> float:
    """``loss_count`` over a whole global batch, at least 1."""
    return max(loss_count(loss_mask, reduction), 1.0)


def step_rows(step: Sequence[Rows], size: int) -> list[int]:
    """Every row of one optimizer step's micro-batches, ascending."""
    return sorted(r for rows in step for r in _row_index(rows, size))


def step_counts(batch: TrainBatch, plan: Sequence[Sequence[Rows]], reduction: Reduction) -> torch.Tensor:
    """This rank's ``loss_count`` per optimizer step of ``plan`` (float64: all-reduced into the
    global batches' denominators by the backend)."""
    return torch.tensor(
        [loss_count(batch.loss_mask[step_rows(s, batch.size)], reduction) for s in plan], dtype=torch.float64
    )


def place_rows(parts: Sequence[tuple[Rows, torch.Tensor]], size: int, width: int) -> torch.Tensor:
    """[size, width] float32 from per-micro-batch [b, <= width] results and the rows they belong to
    (token-budget micro-batches are not in row order); columns past a part's width are 0."""
    out = torch.zeros((size, width), dtype=torch.float32)
    for rows, value in parts:
        index = torch.tensor(_row_index(rows, size), dtype=torch.long)
        out[index] = pad_columns(value.float().cpu(), width)
    return out


def mean_metrics(per_step: Sequence[Metrics]) -> Metrics:
    """Metrics of a rollout's optimizer steps, averaged over the steps."""
    totals: dict[str, float] = {}
    for metrics in per_step:
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + value
    return {key: value / len(per_step) for key, value in totals.items()}


# ------------------------------------------------------------------------------------------ sharding


def rank_rows(num_samples: int, global_batch_size: int, dp_size: int, dp_rank: int) -> list[int]:
    """Rows of a rollout batch that data-parallel rank ``dp_rank`` trains on: of every global batch
    (one optimizer step) a contiguous 1/dp_size share, steps in order."""
    if num_samples % global_batch_size or global_batch_size % dp_size:
        raise ValueError(
            f"{num_samples} samples do not split into global batches of {global_batch_size} shared by "
            f"{dp_size} data-parallel ranks"
        )
    per_rank = global_batch_size // dp_size
    rows: list[int] = []
    for start in range(0, num_samples, global_batch_size):
        first = start + dp_rank * per_rank
        rows.extend(range(first, first + per_rank))
    return rows


def replica_rows(num_samples: int, global_batch_size: int, dp_ranks: Sequence[int]) -> list[list[int]]:
    """Rows of each trainer rank, given each rank's data-parallel rank: the ranks of one model replica
    (TP / PP / CP peers, same data-parallel rank) must see the same rows, and each replica gets its
    ``rank_rows`` share. ``dp_ranks`` must cover 0..dp-1, each the same number of times."""
    dp_size = len(set(dp_ranks))
    counts = {d: list(dp_ranks).count(d) for d in set(dp_ranks)}
    if set(dp_ranks) != set(range(dp_size)) or len(set(counts.values())) != 1:
        raise ValueError(
            f"data-parallel ranks {list(dp_ranks)} do not form replicas 0..{dp_size - 1} of equal size"
        )
    return [rank_rows(num_samples, global_batch_size, dp_size, d) for d in dp_ranks]


def replica_leaders(dp_ranks: Sequence[int]) -> list[int]:
    """Index of the first rank of each replica, in data-parallel order: where a replica's results
    (identical on its ranks) are read."""
    first: dict[int, int] = {}
    for index, d in enumerate(dp_ranks):
        first.setdefault(d, index)
    return [first[d] for d in sorted(first)]


def local_plan(num_local: int, per_rank: int, micro_batch_size: int) -> list[list[slice]]:
    """A rank's own rows (as ``rank_rows`` lists them) split into optimizer steps of ``per_rank`` rows,
    each into micro-batches of ``micro_batch_size`` rows: slices into the rank's rows."""
    if num_local % per_rank or per_rank % micro_batch_size:
        raise ValueError(
            f"{num_local} rows do not split into steps of {per_rank} and micro-batches of {micro_batch_size}"
        )
    return [
        [slice(i, i + micro_batch_size) for i in range(start, start + per_rank, micro_batch_size)]
        for start in range(0, num_local, per_rank)
    ]


# ----------------------------------------------------------------------------------- learning rate


def lr_at(step: int, opt: OptimizerSpec, total_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based) out of ``total_steps``.

    Warm-up: lr * (step + 1) / lrWarmupSteps for the first lrWarmupSteps steps (never 0). Then
    constant: lr; linear / cosine: from lr towards minLr over the remaining total_steps - warm-up
    steps, progress = (step - warm-up) / (remaining), held at minLr past the end.
    """
    warmup = opt.lr_warmup_steps
    if step < warmup:
        return opt.lr * (step + 1) / warmup
    if opt.lr_decay_style == "constant":
        return opt.lr
    progress = min(max(step - warmup, 0) / max(total_steps - warmup, 1), 1.0)
    if opt.lr_decay_style == "linear":
        factor = 1.0 - progress
    elif opt.lr_decay_style == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown lrDecayStyle {opt.lr_decay_style!r}")
    return opt.min_lr + (opt.lr - opt.min_lr) * factor


# ---------------------------------------------------------------------------------------- results


@dataclass
class LogProbs:
    """Per-token results of a no-grad forward pass, [B, T] float32 on CPU (T: the longest response)."""

    logp: torch.Tensor  # the policy's log-probs (old_logp for the next train call)
    ref_logp: torch.Tensor | None  # the frozen reference model's, when it exists (KL loss / klCoef)
    entropy: torch.Tensor | None  # the policy's entropy per token
    values: torch.Tensor | None = None  # the critic's V before each response token (ppo only)


# ------------------------------------------------------------------------------------ the interfaces


@runtime_checkable
class TrainerBackend(WeightSender, Protocol):
    """What the driver uses: a group of trainer ranks seen as one trainer (``group.TrainerGroup``),
    which it also hands to the weight transports (``sync.base.WeightSender``) and to the colocated
    turns (``colocation.Turns``).

    Per-token tensors are [len(samples), T] over response tokens (T = the longest response), laid out
    as ``build_batch`` does; everything crossing it is CPU tensors or plain Python values.
    """

    def logprobs(self, samples: Sequence[Sample]) -> LogProbs:
        """Log-probs (and reference log-probs, entropy) of the samples' response tokens, no grad."""
        ...

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
        """One rollout's optimizer steps; returns metrics averaged over them. ``values`` (the critic's,
        from ``logprobs``) and ``returns`` (GAE's) train the critic (advantageEstimator ppo).

        ``samples`` is a whole number of global batches, at most rollout.batchSize groups (dynamic
        sampling may bring fewer); each global batch is one optimizer step. ``old_logp`` None: the
        samples are one global batch, and the log-probs of the step's own forward pass are the old
        ones (``skips_logprobs_pass``)."""
        ...

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The policy's weights under Hugging Face names (CPU), for weight sync."""
        ...

    def save(self, path: str) -> None:
        """Checkpoint model (and critic), optimizers, schedule and RNG state under ``path``."""
        ...

    def load(self, path: str) -> None:
        """Restore what ``save`` wrote, so training continues bit-for-bit."""
        ...

    def offload(self) -> list[dict[str, float]]:
        """Every rank's state off the GPU (colocated turns); per rank its GPU memory after."""
        ...

    def onload(self) -> list[dict[str, float]]:
        """Back on the GPU for the trainer's turn."""
        ...

    def memory_use(self) -> list[dict[str, float]]:
        """Per rank: GPU and host memory now and their peaks since the previous call (the colocated
        turns read it after every phase; ``offload.Offloadable.memory_use``)."""
        ...

    def lost_ranks(self) -> list[int]:
        """Ranks whose process is gone (the driver restarts the group from its last checkpoint)."""
        ...

    def shutdown(self) -> None:
        """Stop every rank."""
        ...


@runtime_checkable
class TrainerRank(Protocol):
    """One rank of a trainer group (a Ray actor); a backend's group drives its ranks through this and
    through the exporting calls of ``weight_source.WeightSource`` (``rank_base.TrainerRankBase`` has
    what the backends share)."""

    def master_address(self) -> tuple[str, int]:
        """Address and a free port for the process group's rendezvous (asked of rank 0)."""
        ...

    def init_process_group(self, master_addr: str, master_port: int) -> None: ...

    def logprobs(self, batch: TrainBatch) -> LogProbs: ...

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
    ) -> Metrics: ...

    def named_tensors(self) -> dict[str, torch.Tensor]: ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...

    def set_seed(self, seed: int) -> None: ...

    def offload(self) -> dict[str, float]: ...

    def onload(self) -> dict[str, float]: ...

    def memory_use(self, reset_peaks: bool = True) -> dict[str, float]: ...

    def shutdown(self) -> None: ...


def check_per_token(name: str, tensor: Any, batch: TrainBatch) -> torch.Tensor:
    """A per-token input must be a [B, >= T] tensor; returns it as float32 [B, T]."""
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2 or tensor.shape[0] != batch.size:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name}: expected a [{batch.size}, T] tensor, got {shape}")
    if tensor.shape[1] < int(batch.response_lengths.max()):
        raise ValueError(
            f"{name}: {tensor.shape[1]} columns but the longest response has {int(batch.response_lengths.max())}"
        )
    return pad_columns(tensor.float(), batch.width)


def check_policy_inputs(
    batch: TrainBatch,
    advantages: Any,
    old_logp: Any,
    ref_logp: Any,
    use_kl_loss: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``train``'s per-token inputs checked and padded to the batch (every backend's contract)."""
    advantages = check_per_token("advantages", advantages, batch)
    if old_logp is not None:
        old_logp = check_per_token("old_logp", old_logp, batch)
    if ref_logp is not None:
        ref_logp = check_per_token("ref_logp", ref_logp, batch)
    elif use_kl_loss:
        raise ValueError("algorithm.useKLLoss needs ref_logp (from logprobs())")
    return advantages, old_logp, ref_logp
