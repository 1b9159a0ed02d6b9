"""The ``megatron`` trainer backend: Megatron-core GPTModel built from a Hugging Face config.

Modules that need no megatron-core (pure, unit-tested on CPU, importable in CI):

- ``arch``: supported HF architectures and the ``ModelShape`` read from an HF config.
- ``parallel``: parallelism validation (refused before any GPU work) and vocab padding.
- ``convert``: HF <-> Megatron state dicts (fused qkv, gate/up, vocab padding).
- ``shard``: tensor-parallel split/gather and pipeline stages of a Megatron state dict.
- ``checks``: what the backend refuses (options by name, the layout with its numbers), run by
  ``prepare.prepare`` before Ray starts and again by each rank.
- ``testing``: configs with real shapes and random HF weights for tests and benchmarks.

Modules that need megatron-core at run time (``pip install 'rljob[megatron]'``, GPU): ``model``
(TransformerConfig, GPTModel, loading HF weights, exporting HF weights), ``attention`` (SDPA core
attention), ``fusions`` (plain-torch stand-ins for TE/apex fusions: wgrad accumulation, compiled
RMSNorm and RoPE, fused Adam), ``schedule`` (forward /
backward over micro-batches), ``checkpoint`` (HF export, finding a distributed checkpoint, RNG across
layouts), ``dist_checkpoint`` (model and optimizer as a torch_dist checkpoint that any TP/PP/DP layout
loads), ``checkpoint_convert`` (HF <-> torch_dist conversions on CPU, each checked tensor by
tensor: ``rljob-runtime convert``) and ``backend``
(``MegatronTrainerRank``, run by ``trainer.group.TrainerGroup`` as Ray actors, one per GPU).
"""

from .arch import SUPPORTED_ARCHITECTURES, ModelShape, UnsupportedModelError, model_shape
from .parallel import Parallelism, padded_vocab_size, validate_parallelism

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ModelShape",
    "Parallelism",
    "UnsupportedModelError",
    "model_shape",
    "padded_vocab_size",
    "validate_parallelism",
]
