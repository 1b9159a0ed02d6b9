"""trainer/megatron/optimizer_offload.py on CPU: the streamed, chunked step equals the plain step
bit for bit, the state is off the device between steps and back for ``resident()``.

megatron-core's DistributedOptimizer only builds its bf16 -> fp32 main copies for CUDA tensors, so
here a stand-in with the same attributes (``StandInDistributedOptimizer``, the four group lists and
``_copy_main_params_to_model_params`` as megatron-core 0.16.1 zips them) holds a real torch AdamW;
the real optimizer runs in ``tests/gpu/test_optimizer_offload_gpu.py``."""

from __future__ import annotations

import copy

import pytest
import torch

from rljob_runtime.trainer.megatron.optimizer_offload import OptimizerStateOffload


class StandInDistributedOptimizer:
    """Stand-in for megatron-core's DistributedOptimizer (which needs CUDA): bf16 model params, fp32
    main copies with their own storage, one fp32 model param whose main param is a view into a
    shared buffer (as Megatron's fp32 params are), a torch AdamW over the main params."""

    def __init__(self, shapes: list[tuple[int, ...]], seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.model_float16_groups = [[torch.randn(s, generator=gen).bfloat16() for s in shapes]]
        self.shard_fp32_from_float16_groups = [[p.float().clone() for p in self.model_float16_groups[0]]]
        self.buffer = torch.randn(64, generator=gen)
        self.model_fp32_groups = [[self.buffer[:16].view(4, 4)]]
        self.shard_fp32_groups = [[self.buffer[:16].view(-1)]]
        params = [*self.shard_fp32_from_float16_groups[0], *self.shard_fp32_groups[0]]
        self.optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=False)

    def _copy_main_params_to_model_params(self) -> None:
        for mains, models in zip(self.shard_fp32_from_float16_groups, self.model_float16_groups, strict=True):
            for main, model in zip(mains, models, strict=True):
                model.data.copy_(main.view_as(model))
        # fp32 main params are the model params (views): nothing to copy

    def _copy_model_params_to_main_params(self) -> None:
        for mains, models in zip(self.shard_fp32_from_float16_groups, self.model_float16_groups, strict=True):
            for main, model in zip(mains, models, strict=True):
                main.data.copy_(model.view_as(main))

    def set_grads(self, step: int) -> None:
        gen = torch.Generator().manual_seed(1000 + step)
        for p in self.optimizer.param_groups[0]["params"]:
            p.grad = torch.randn(p.shape, generator=gen)

    def step(self) -> None:
        self.optimizer.step()
        self._copy_main_params_to_model_params()


SHAPES = [(8, 16), (300,), (4, 4, 4), (1,), (2048,)]


def _pair() -> tuple[StandInDistributedOptimizer, StandInDistributedOptimizer, OptimizerStateOffload]:
    plain = StandInDistributedOptimizer(SHAPES)
    streamed = copy.deepcopy(plain)
    # Three fp32 tensors (param + 2 moments) of 4 bytes: the 2048-element param alone is 24 KiB,
    # so a 4 KiB chunk makes several chunks and one oversize chunk of its own.
    offload = OptimizerStateOffload(streamed, chunk_bytes=4096).install()
    return plain, streamed, offload


def test_streamed_steps_equal_plain_steps_bit_for_bit() -> None:
    plain, streamed, offload = _pair()
    assert len(offload.chunks()) >= 3
    for step in range(3):
        plain.set_grads(step)
        streamed.set_grads(step)
        plain.step()
        streamed.step()
        for a, b in zip(plain.model_float16_groups[0], streamed.model_float16_groups[0], strict=True):
            assert torch.equal(a, b)
        assert torch.equal(plain.buffer, streamed.buffer)  # the fp32 param stepped in place
    assert offload.stats.steps == 3
    # Each step moves the state in and out once: Megatron's main -> model copy after the inner step
    # (done per chunk inside it) must not bring everything back (a 4B's 48 GB at once).
    state = sum(3 * 4 * torch.Size(s).numel() for s in SHAPES)
    assert offload.stats.bytes_in == 3 * state - 2 * 4 * sum(torch.Size(s).numel() for s in SHAPES)
    assert offload.stats.bytes_out == 3 * state + 4 * sum(torch.Size(s).numel() for s in SHAPES)
    with offload.resident():
        for a, b in zip(
            plain.shard_fp32_from_float16_groups[0], streamed.shard_fp32_from_float16_groups[0], strict=True
        ):
            assert torch.equal(a, b)
            sa, sb = plain.optimizer.state[a], streamed.optimizer.state[b]
            assert torch.equal(sa["exp_avg"], sb["exp_avg"])
            assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
            assert float(sa["step"]) == float(sb["step"]) == 3.0


def test_state_is_off_the_device_between_steps_and_back_in_resident() -> None:
    _, streamed, offload = _pair()
    main = streamed.shard_fp32_from_float16_groups[0][0]
    assert main.untyped_storage().nbytes() == 0  # installed: out before the first step
    streamed.set_grads(0)
    streamed.step()
    assert offload.device_bytes() == 0
    state = streamed.optimizer.state[main]
    assert state["exp_avg"].untyped_storage().nbytes() == 0  # created by the step, sent out with it
    expected = sum(3 * 4 * torch.Size(s).numel() for s in SHAPES)
    assert offload.host_bytes() == expected
    with offload.resident():
        assert offload.device_bytes() == expected
        assert torch.isfinite(main).all()
    assert offload.device_bytes() == 0
    # The fp32 param that lives in a shared buffer is never freed.
    assert streamed.buffer.untyped_storage().nbytes() == 64 * 4
    assert offload.stats.bytes_out >= expected and offload.stats.bytes_in >= expected - 3 * 4 * 2048


def test_step_outside_resident_groups_are_restored() -> None:
    _, streamed, _ = _pair()
    streamed.set_grads(0)
    streamed.step()
    params = streamed.optimizer.param_groups[0]["params"]
    assert len(params) == len(SHAPES) + 1  # narrowed per chunk during the step, whole after
    assert streamed.shard_fp32_from_float16_groups[0][0] is params[0]
    assert len(streamed.model_float16_groups[0]) == len(SHAPES)


def test_megatron_copies_outside_a_step_bring_the_state_in() -> None:
    """Megatron also copies main -> model and model -> main outside a step (loading, reloading
    params): the overrides make the main params resident for them instead of touching freed storage."""
    _, streamed, offload = _pair()
    model = streamed.model_float16_groups[0][0]
    model.data.zero_()
    streamed._copy_main_params_to_model_params()
    assert model.abs().sum() > 0
    model.data.fill_(0.5)
    streamed._copy_model_params_to_main_params()
    with offload.resident():
        assert torch.equal(streamed.shard_fp32_from_float16_groups[0][0], torch.full((8, 16), 0.5))
    assert offload.device_bytes() == 0


def test_refuses_what_it_cannot_stream() -> None:
    with pytest.raises(TypeError, match="distributed optimizer"):
        OptimizerStateOffload(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]))
    shared = StandInDistributedOptimizer(SHAPES)
    base = torch.zeros(100)
    view = base[:10]  # freeing its storage would free all of `base`
    shared.shard_fp32_from_float16_groups[0][0] = view
    shared.optimizer.param_groups[0]["params"][0] = view
    with pytest.raises(ValueError, match="shares its storage"):
        OptimizerStateOffload(shared)
