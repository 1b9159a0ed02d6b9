"""A fix for megatron-core 0.16.1's distributed optimizer when a param group holds parameters of two
dtypes (fp32 and bf16).

``DistributedOptimizer`` records each model parameter's place in its param group as the order it met
them (``_build_optimizer_group_ranges``: ``model_param_group_index_map``), but builds the inner
optimizer's group as the fp32 parameters first, then the fp32 main copies of the bf16 ones
(``_build_model_and_main_param_groups``). Every checkpoint path (``get_parameter_state_dp_zero``,
``_get_main_param_and_optimizer_states``, their setters) indexes the second list with the first order,
so in a mixed group it reads and writes another parameter's main copy and Adam state: a save fails on
the shapes, or a load puts states in the wrong places. Megatron-LM never mixes (its Float16Module casts
every parameter to bf16); here the norms keep fp32 weights in a bf16 model (megatron-core's local
norms and the "norm" fusion), so a 1-D bf16 parameter (Qwen2's qkv biases) lands in their
no-weight-decay group. ``align_group_index_map`` rewrites the map to the inner groups' order; for a
group of one dtype that is the order it had.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def main_order(params: Sequence[Any], is_fp32: Callable[[Any], bool]) -> list[Any]:
    """A group's parameters in the order of the inner optimizer's main parameters: fp32 ones first,
    then the others, each in their original order."""
    return [p for p in params if is_fp32(p)] + [p for p in params if not is_fp32(p)]


def _is_fp32(param: torch.Tensor) -> bool:
    return param.dtype == torch.float32


def align_group_index_map(optimizer: Any, is_fp32: Callable[[Any], bool] = _is_fp32) -> int:
    """Point every distributed optimizer's ``model_param_group_index_map`` (of ``optimizer`` or of the
    members of a chained one) at its parameter's real place in the inner optimizer's group; returns
    how many entries moved (0 unless a group mixes dtypes). Optimizers without the map are left."""
    moved = 0
    for member in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        index_map = getattr(member, "model_param_group_index_map", None)
        ranges = getattr(member, "opt_group_ranges", None)
        if index_map is None or ranges is None:
            continue
        for group_index, group_range in enumerate(ranges):
            for order, param in enumerate(main_order(group_range["params"], is_fp32)):
                if index_map[param] != (group_index, order):
                    index_map[param] = (group_index, order)
                    moved += 1
    return moved
