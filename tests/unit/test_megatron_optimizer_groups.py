"""optimizer_groups.align_group_index_map: megatron-core's distributed optimizer indexes its inner param
groups (fp32 parameters first, then the fp32 main copies of the bf16 ones) with the order it met the
parameters in; the map is rewritten to the inner order, which a checkpoint's reads and writes follow."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from rljob_runtime.trainer.megatron.optimizer_groups import align_group_index_map, main_order


def fake_distributed_optimizer(groups: list[list[torch.Tensor]]) -> Any:
    """What megatron-core 0.16 builds: the map in meeting order, the inner groups fp32 first."""
    index_map = {p: (g, i) for g, params in enumerate(groups) for i, p in enumerate(params)}
    inner = [
        [
            p.detach().float().view(-1)
            for p in [
                *(q for q in params if q.dtype == torch.float32),
                *(q for q in params if q.dtype != torch.float32),
            ]
        ]
        for params in groups
    ]
    return SimpleNamespace(
        model_param_group_index_map=index_map,
        opt_group_ranges=[{"params": params} for params in groups],
        param_groups=[{"params": main} for main in inner],
    )


def test_main_order_puts_fp32_first_and_keeps_each_dtype_in_order() -> None:
    assert main_order(["b1", "f1", "b2", "f2"], lambda p: p.startswith("f")) == ["f1", "f2", "b1", "b2"]


def test_a_mixed_group_maps_each_parameter_to_its_own_main_copy() -> None:
    norm_a, norm_b = torch.ones(8), torch.ones(8) * 2  # fp32 norm weights (1-D)
    bias = torch.full((3,), 5.0, dtype=torch.bfloat16)  # a bf16 qkv bias met between them
    weight = torch.full((4, 8), 7.0, dtype=torch.bfloat16)
    opt = fake_distributed_optimizer([[weight], [norm_a, bias, norm_b]])
    assert opt.model_param_group_index_map[bias] == (1, 1)  # megatron's: the slot of norm_b's copy
    assert align_group_index_map(opt) == 2  # bias and norm_b moved; the weight's group was one dtype
    for param, (g, i) in opt.model_param_group_index_map.items():
        main = opt.param_groups[g]["params"][i]
        assert main.numel() == param.numel() and torch.equal(main, param.float().view(-1))


def test_groups_of_one_dtype_and_plain_optimizers_are_left_alone() -> None:
    params = [torch.ones(2, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)]
    opt = fake_distributed_optimizer([params, [torch.ones(4)]])
    before = dict(opt.model_param_group_index_map)
    assert align_group_index_map(opt) == 0 and opt.model_param_group_index_map == before
    chained = SimpleNamespace(chained_optimizers=[opt, SimpleNamespace()])  # a member without the map
    assert align_group_index_map(chained) == 0
    assert align_group_index_map(torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])) == 0
