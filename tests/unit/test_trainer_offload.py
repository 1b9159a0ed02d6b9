"""The trainer's storage swap (``trainer/offload.py``) on CPU storages: views survive, groups are
independent, late tensors are found, and both backends' groups hold every storage of their
parameters, gradients and optimizer state (a census after offload finds none left), so that a step
after offload + onload is the step a twin that never offloaded takes. The GPU memory itself:
tests/gpu/test_trainer_offload_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rljob_runtime.trainer.offload import Group, StorageOffloader, grads, module_tensors, optimizer_tensors

CPU = torch.device("cpu")


def test_views_survive_and_storages_are_empty_while_offloaded() -> None:
    flat = torch.arange(12, dtype=torch.float32)
    a, b = flat[:6].view(2, 3), flat[6:]  # two parameters viewing one buffer (Megatron's layout)
    c = torch.randn(4, 4).t()  # strided
    late: list[torch.Tensor] = []
    offloader = StorageOffloader(
        {"weights": Group(lambda: [a, b]), "training": Group(lambda: [c, *late])}, CPU
    )
    want = {"a": a.clone(), "b": b.clone(), "c": c.clone()}
    assert offloader.nbytes("weights") == 48 and offloader.nbytes("training") == 64
    assert offloader.offload() == 48 + 64
    assert a.untyped_storage().nbytes() == 0 and c.untyped_storage().nbytes() == 0
    assert offloader.offload() == 0  # idempotent
    assert offloader.onload() == 112 and offloader.onload() == 0
    assert torch.equal(a, want["a"]) and torch.equal(b, want["b"]) and torch.equal(c, want["c"])
    b.add_(1)  # a view still writes into the shared buffer
    assert flat[6] == want["b"][0] + 1

    late.append(torch.ones(5))  # made after the first offload (optimizer state after a step)
    offloader.offload(["training"])
    assert late[0].untyped_storage().nbytes() == 0 and a.untyped_storage().nbytes() == 48
    with offloader.resident("training"):
        assert torch.equal(late[0], torch.ones(5)) and torch.equal(c, want["c"])
    assert offloader.is_offloaded("training") and not offloader.is_offloaded("weights")
    offloader.onload()
    assert torch.equal(late[0], torch.ones(5))


def test_a_shared_storage_belongs_to_the_first_group_and_unkept_groups_come_back_zero() -> None:
    shared = torch.randn(3)
    grad = torch.randn(4)
    offloader = StorageOffloader(
        {
            "weights": Group(lambda: [shared]),
            "grads": Group(lambda: [grad], keep=False),
            "training": Group(lambda: [shared[1:]]),  # an optimizer holding a view of a weight
        },
        CPU,
    )
    offloader.offload(["training"])  # the weights stay: so does the storage they share
    assert shared.untyped_storage().nbytes() == 12
    offloader.onload()
    want = shared.clone()
    offloader.offload()
    offloader.onload()
    assert torch.equal(shared, want) and torch.equal(grad, torch.zeros(4))


def _census(*roots: Any) -> list[torch.Tensor]:
    """Every tensor a training step touches: parameters, buffers, grads, main grads, optimizer state."""
    modules = [r for r in roots if isinstance(r, torch.nn.Module)]
    optimizers = [r for r in roots if not isinstance(r, torch.nn.Module)]
    return [
        t
        for t in [*module_tensors(*modules), *grads(*modules), *optimizer_tensors(*optimizers)]
        if t is not None
    ]


def _spec(model: Path, backend: str) -> Any:
    from rljob_runtime.config import config_from_document

    return config_from_document(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": "/unused.jsonl"},
            "algorithm": {"useKLLoss": True, "klLossCoef": 0.01},  # a reference model too
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 2},
            "training": {"backend": backend, "globalBatchSize": 4, "microBatchSize": 2},
            "resources": {
                "device": "cpu" if backend == "torch" else "cuda",
                "trainer": {"nodes": 1, "gpusPerNode": 1},
            },
        }
    ).spec


def _batch() -> tuple[Any, torch.Tensor, torch.Tensor]:
    from rljob_runtime.data.sample import Sample
    from rljob_runtime.trainer.base import build_batch

    samples = [
        Sample(
            index=i,
            prompt_ids=[5 + i, 7, 9],
            response_ids=[11, 12 + i, 13],
            loss_mask=[1, 1, 1],
            rollout_logprobs=[-1.0, -1.0, -1.0],
        )
        for i in range(4)
    ]
    batch = build_batch(samples)
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3, [0.5] * 3, [-0.5] * 3])
    return batch, advantages, batch.rollout_logp


def _step(rank: Any, batch: Any, advantages: torch.Tensor) -> dict[str, float]:
    lp = rank.logprobs(batch)
    return rank.train(batch, advantages, lp.logp, lp.ref_logp)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rljob_runtime.models.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("offload") / "model", seed=3)


def _offload_step_equals_twin(rank: Any, twin: Any, roots: list[Any]) -> None:
    batch, advantages, _ = _batch()
    _step(rank, batch, advantages)
    _step(twin, batch, advantages)
    offloader = StorageOffloader(rank._offload_groups(), CPU)
    before = sum(t.untyped_storage().nbytes() for t in _census(*roots))
    assert before > 0
    offloader.offload()
    left = [t.shape for t in _census(*roots) if t.untyped_storage().nbytes()]
    assert not left, f"storages the groups missed: {left[:5]}"
    rank._offloader = offloader  # the rank refuses to train on freed memory
    with pytest.raises(RuntimeError, match="offloaded: onload"):
        rank.logprobs(batch)
    offloader.onload()
    mine, theirs = _step(rank, batch, advantages), _step(twin, batch, advantages)
    assert mine == theirs
    for p, q in zip(rank.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_torch_backend_offloads_everything_and_steps_like_its_twin(tiny_model: Path) -> None:
    from rljob_runtime.trainer.torch_backend import TorchTrainerRank

    spec = _spec(tiny_model, "torch")
    rank, twin = TorchTrainerRank(spec, str(tiny_model)), TorchTrainerRank(spec, str(tiny_model))
    assert rank.ref_model is not None
    for tensor in module_tensors(rank.model, rank.ref_model):  # CPU weights map the file (not resizable);
        tensor.data = tensor.data.clone()  # CUDA ones, the offloader's case, are allocator blocks
    _offload_step_equals_twin(rank, twin, [rank.model, rank.ref_model, rank.optimizer])


def test_the_megatron_backends_groups_hold_every_storage(cpu_megatron: None) -> None:
    """Megatron's optimizer wants CUDA, so on CPU the rank's groups are checked over a DDP model (its
    grad buffer and main_grad views), a torch Adam that has stepped, a reference model, and a ppo
    critic built the same way; the step after onload is tests/gpu/test_trainer_offload_gpu.py's."""
    from test_megatron_fusions import UNTIED, _ddp_model, _two_micro_batches

    from rljob_runtime.trainer.megatron import model_shape, validate_parallelism
    from rljob_runtime.trainer.megatron.backend import MegatronTrainerRank
    from rljob_runtime.trainer.megatron.critic import MegatronCritic
    from rljob_runtime.trainer.megatron.model import build_gpt_model

    def trained() -> tuple[Any, torch.optim.Optimizer]:
        ddp, shape = _ddp_model(UNTIED, torch.float32, ())
        _two_micro_batches(ddp, shape)
        for param in ddp.module.parameters():
            param.grad = param.main_grad.clone()  # what Megatron's optimizer copies from the grad buffer
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        optimizer.step()
        return ddp, optimizer

    ddp, optimizer = trained()
    critic_ddp, critic_optimizer = trained()
    ref = build_gpt_model(
        model_shape(UNTIED), validate_parallelism(model_shape(UNTIED), gpus=1), dtype=torch.float32
    )
    rank = MegatronTrainerRank.__new__(MegatronTrainerRank)
    rank.model, rank.optimizer, rank.ref_model = ddp, optimizer, ref
    rank.critic = MegatronCritic(critic_ddp, critic_optimizer, None, None, None, CPU)  # type: ignore[arg-type]
    roots = [ddp.module, ref, optimizer, *[_Holder(b.grad_data) for b in ddp.buffers]]
    roots += [critic_ddp.module, critic_optimizer, *[_Holder(b.grad_data) for b in critic_ddp.buffers]]
    want = {k: v.clone() for k, v in ddp.module.state_dict().items() if isinstance(v, torch.Tensor)}
    moments = [t.clone() for t in optimizer_tensors(optimizer)]
    offloader = StorageOffloader(rank._offload_groups(), CPU)
    offloader.offload()
    left = [t.shape for t in _census(*roots) if t.untyped_storage().nbytes()]
    assert not left, f"storages the groups missed: {left[:5]}"
    offloader.onload()
    for name, value in ddp.module.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, want[name]), name
    assert all(torch.equal(a, b) for a, b in zip(optimizer_tensors(optimizer), moments, strict=True))
    assert all(not b.grad_data.any() for b in ddp.buffers)  # gradients come back zeroed, not copied


class _Holder(torch.nn.Module):
    """A bare tensor counted in the census as a buffer (Megatron's DDP grad buffers)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("t", tensor, persistent=False)
