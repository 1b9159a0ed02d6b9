"""The ``megatron`` trainer backend: Megatron-core GPTModel built from a Hugging Face config.

Modules that need no megatron-core (pure, unit-tested on CPU, importable in CI):

- ``arch``: supported HF architectures and the ``ModelShape`` read from an HF config.
- ``parallel``: parallelism validation (refused before any GPU work) and vocab padding.
- ``convert``: HF <-> Megatron state dicts (fused qkv, gate/up, vocab padding).
- ``shard``: tensor-parallel split/gather and pipeline stages of a Megatron state dict.
- ``testing``: configs with real shapes and random HF weights for tests and benchmarks.

Modules that import megatron-core (``pip install 'rljob[megatron]'``, GPU): ``model`` (TransformerConfig,
GPTModel, loading HF weights, exporting HF weights) and ``backend`` (``MegatronTrainerRank``: the
trainer rank; not yet wired into ``create_trainer``/Ray, no checkpoints).
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
