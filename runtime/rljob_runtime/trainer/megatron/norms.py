"""``RMSNorm``: the local layer spec's norm (``WrappedTorchNorm``, a ``torch.nn.RMSNorm``) with the
constructor megatron-core calls and the mark sequence parallelism needs.

megatron-core's torch norms refuse ``sequence_parallel``: its own sequence-parallel norms (TE, apex)
mark their weights, and ``finalize_model_grads`` all-reduces the gradients of marked weights over
the tensor-parallel group (each rank's norm saw only its slice of the sequence). This one computes what
``torch.nn.RMSNorm`` computes (``F.rms_norm``), with one weight of the same name, dtype and initial
value, so checkpoints and conversions are unchanged; ``fusions.FusedRMSNorm`` is it, compiled.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_config import TransformerConfig


class RMSNorm(torch.nn.Module):
    def __init__(
        self,
        config: TransformerConfig,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ) -> None:
        super().__init__()
        # What WrappedTorchNorm refuses, refused here too (config fields win over the unused kwargs).
        if config.normalization != "RMSNorm":
            raise NotImplementedError(f"{type(self).__name__}: normalization={config.normalization!r}")
        if config.layernorm_zero_centered_gamma or config.persist_layer_norm:
            raise NotImplementedError(f"{type(self).__name__}: zero-centred gamma / persistent layer norm")
        if config.memory_efficient_layer_norm:
            raise NotImplementedError(f"{type(self).__name__}: memory_efficient_layer_norm")
        self.normalized_shape = (hidden_size,)
        self.eps = float(eps)
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))  # default dtype, as torch.nn.RMSNorm
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]  # Megatron's mark

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"
