"""The megatron backend's wiring, on CPU: rows sharded by data-parallel rank (TP/PP peers of one
replica get the same rows), results read from one rank per replica, and prepare.prepare refusing
what the backend does not support, by name and with the numbers, before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.data.sample import Sample
from rljob_runtime.prepare import prepare
from rljob_runtime.run_error import RunError
from rljob_runtime.trainer.base import rank_rows, replica_leaders, replica_rows
from rljob_runtime.trainer.group import TrainerGroup
from rljob_runtime.trainer.megatron.checks import check_layout, unsupported_options
from rljob_runtime.trainer.megatron.testing import QWEN3_0_6B, SMOLLM2_135M

# ------------------------------------------------------------------------------------ row sharding


def test_tp_peers_of_a_replica_get_the_same_rows() -> None:
    # 4 GPUs, TP 2 x DP 2 in Megatron's order (TP fastest): ranks 0,1 are replica 0, ranks 2,3 replica 1.
    rows = replica_rows(16, 8, [0, 0, 1, 1])
    assert rows[0] == rows[1] == rank_rows(16, 8, 2, 0) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert rows[2] == rows[3] == rank_rows(16, 8, 2, 1) == [4, 5, 6, 7, 12, 13, 14, 15]
    assert replica_leaders([0, 0, 1, 1]) == [0, 2]


def test_pure_data_parallel_is_the_torch_sharding() -> None:
    assert replica_rows(12, 6, [0, 1, 2]) == [rank_rows(12, 6, 3, r) for r in range(3)]
    assert replica_leaders([0, 1, 2]) == [0, 1, 2]


def test_interleaved_replicas_and_leaders_in_dp_order() -> None:
    # PP 2 x DP 2 with DP before PP in the rank order: ranks 0,1 are stage 0 of replicas 0,1.
    dp = [0, 1, 0, 1]
    rows = replica_rows(8, 8, dp)
    assert rows[0] == rows[2] == [0, 1, 2, 3] and rows[1] == rows[3] == [4, 5, 6, 7]
    assert replica_leaders(dp) == [0, 1]


@pytest.mark.parametrize("dp", [[0, 2], [0, 0, 1], [1, 1]])
def test_replicas_must_be_complete_and_equal(dp: list[int]) -> None:
    with pytest.raises(ValueError, match="do not form replicas"):
        replica_rows(8, 4, dp)


class _Ref:
    def __init__(self, value: Any) -> None:
        self.value = value


class _FakeRank:
    """A rank as a Ray actor handle: ``.method.remote(...)`` records the call."""

    def __init__(self, calls: list[tuple[int, str, Any]], index: int) -> None:
        self.calls, self.index = calls, index

    def __getattr__(self, name: str) -> Any:
        rank = self

        class _Method:
            def remote(self, *args: Any, **kwargs: Any) -> _Ref:
                rank.calls.append((rank.index, name, args))
                return _Ref(None)

        return _Method()


def test_group_sends_each_replica_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    import rljob_runtime.trainer.group as group_mod

    spec = _spec(tensor=2, gpus=4)
    calls: list[tuple[int, str, Any]] = []
    group = TrainerGroup(spec, [_FakeRank(calls, i) for i in range(4)], dp_ranks=[0, 0, 1, 1])
    monkeypatch.setattr(group_mod, "_gather", lambda refs, timeout_s=None: [r.value for r in refs])
    samples = [Sample(prompt_ids=[1, 2], response_ids=[3 + i], loss_mask=[1]) for i in range(8)]
    with pytest.raises(AttributeError):  # the fake ranks return no log-probs: only the routing matters
        group.logprobs(samples)
    sent = {rank: args[0].response_ids[:, 0].tolist() for rank, name, args in calls if name == "logprobs"}
    assert sent[0] == sent[1] == [3, 4, 5, 6] and sent[2] == sent[3] == [7, 8, 9, 10]


def test_two_threads_queue_the_ranks_collectives_in_one_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver thread saves while the rollout manager's thread exports weights (an engine
    relaunch): every rank must get the two collectives in the same order, or they deadlock."""
    import threading
    import time

    import rljob_runtime.trainer.group as group_mod

    calls: list[tuple[int, str, Any]] = []

    class _SlowRank(_FakeRank):  # a slow submission, so unlocked submissions would interleave
        def __getattr__(self, name: str) -> Any:
            method = super().__getattr__(name)

            class _Slow:
                def remote(self, *args: Any, **kwargs: Any) -> _Ref:
                    time.sleep(0.002)
                    return method.remote(*args, **kwargs)

            return _Slow()

    group = TrainerGroup(_spec(tensor=2, gpus=2), [_SlowRank(calls, i) for i in range(2)], dp_ranks=[0, 0])
    monkeypatch.setattr(group_mod, "_gather", lambda refs, timeout_s=None: [{} for _ in refs])
    threads = [
        threading.Thread(target=lambda: [group.save("/ckpt") for _ in range(20)]),
        threading.Thread(target=lambda: [group.named_tensors() for _ in range(20)]),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_rank = [[name for rank, name, _ in calls if rank == r] for r in range(2)]
    assert len(per_rank[0]) == 40 and per_rank[0] == per_rank[1]


EXPORTING = ("named_tensors", "write_weights", "begin_ipc", "weight_bucket_specs", "broadcast_weights")


def _export_calls(group: TrainerGroup, calls: list[tuple[int, str, Any]]) -> dict[str, list[int]]:
    """Which ranks each exporting operation of ``group`` reaches."""
    group.named_tensors()
    group.write_weights(None, None)
    group.begin_ipc(1 << 20, "flattened", None)
    group.weight_bucket_specs(1 << 20)
    group.broadcast_weights([])
    return {m: [rank for rank, name, _ in calls if name == m] for m in EXPORTING}


@pytest.mark.parametrize(
    ("layouts", "exporters"),
    [
        # EP 2 over DP 2 (an MoE model): the expert gather is a collective of both data-parallel ranks.
        ([{"dp_rank": 0, "exports_weights": 1}, {"dp_rank": 1, "exports_weights": 1}], [0, 1]),
        # TP 2 x DP 2, dense: data-parallel rank 0's replica.
        ([{"dp_rank": d, "exports_weights": int(d == 0)} for d in (0, 0, 1, 1)], [0, 1]),
        # EP 2 of DP 4: ranks 0 and 1 hold the experts of replica 0 between them.
        ([{"dp_rank": d, "exports_weights": int(d < 2)} for d in range(4)], [0, 1]),
        # a layout without the key (the torch backend's ranks have none): data-parallel rank 0.
        ([{"dp_rank": 0}, {"dp_rank": 1}], [0]),
    ],
)
def test_every_exporting_rank_joins_the_export(
    monkeypatch: pytest.MonkeyPatch, layouts: list[dict[str, int]], exporters: list[int]
) -> None:
    import rljob_runtime.trainer.group as group_mod

    calls: list[tuple[int, str, Any]] = []
    group = TrainerGroup(_spec(gpus=len(layouts)), [_FakeRank(calls, i) for i in range(len(layouts))])
    group.use_layouts(layouts)
    monkeypatch.setattr(group_mod, "_gather", lambda refs, timeout_s=None: [r.value for r in refs])
    assert group.dp_ranks == [lay["dp_rank"] for lay in layouts]
    assert _export_calls(group, calls) == {m: exporters for m in EXPORTING}


def test_a_group_without_layouts_exports_from_data_parallel_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    import rljob_runtime.trainer.group as group_mod

    calls: list[tuple[int, str, Any]] = []
    group = TrainerGroup(_spec(gpus=2), [_FakeRank(calls, i) for i in range(2)])  # the torch backend's
    monkeypatch.setattr(group_mod, "_gather", lambda refs, timeout_s=None: [r.value for r in refs])
    assert _export_calls(group, calls) == {m: [0] for m in EXPORTING}


def test_global_rank_0_must_export() -> None:
    from rljob_runtime.trainer.group import exporting_ranks

    with pytest.raises(ValueError, match="global rank 0 does not export the weights"):
        exporting_ranks([{"dp_rank": 0, "exports_weights": 0}, {"dp_rank": 1, "exports_weights": 1}])


# ------------------------------------------------------------------------------- prepare refusals


def _spec(
    *, tensor: int = 1, pipeline: int = 1, gpus: int = 1, path: str = "/unused", **over: Any
) -> RLTrainingJobSpec:
    doc: dict[str, Any] = {
        "model": {"path": path, "dtype": "bfloat16"},
        "data": {"path": "/unused.jsonl"},
        "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4},
        "training": {
            "backend": "megatron",
            "globalBatchSize": 8,
            "microBatchSize": 1,
            "parallelism": {"tensor": tensor, "pipeline": pipeline},
        },
        "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": gpus}},
    }
    for section, values in over.items():
        doc.setdefault(section, {}).update(values)
    return RLTrainingJobSpec.model_validate(doc)


def _model(tmp_path: Path, config: dict[str, Any]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))  # config.json alone: no weights needed
    return str(tmp_path)


def test_prepare_refuses_heads_that_do_not_split_over_tp(tmp_path: Path) -> None:
    spec = _spec(tensor=2, gpus=2, path=_model(tmp_path, SMOLLM2_135M))
    with pytest.raises(RunError) as err:
        prepare(spec)
    message = str(err.value)
    assert message.startswith("training.backend megatron: parallelism does not fit LlamaForCausalLM")
    assert "9 attention heads are not divisible by tensor parallel size 2" in message
    assert "3 key/value heads are neither a multiple nor a divisor of tensor parallel size 2" in message


def test_prepare_refuses_layers_that_do_not_split_over_pp(tmp_path: Path) -> None:
    # (GPUs that tp * pp * cp does not divide are refused earlier, by the spec's own rules.)
    spec = _spec(pipeline=4, gpus=4, path=_model(tmp_path, {**QWEN3_0_6B, "num_hidden_layers": 30}))
    with pytest.raises(RunError, match="30 layers are not divisible by pipeline parallel size 4"):
        prepare(spec)


def test_prepare_refuses_an_unsupported_architecture(tmp_path: Path) -> None:
    config = {**SMOLLM2_135M, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    with pytest.raises(
        RunError, match=r"HF architecture GPT2LMHeadModel is not supported .* Qwen3ForCausalLM"
    ):
        prepare(_spec(path=_model(tmp_path, config)))


def test_a_layout_that_fits_is_refused_only_for_missing_megatron_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def without_megatron(name: str, *args: Any) -> Any:
        return None if name.startswith("megatron") else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_megatron)
    spec = _spec(path=_model(tmp_path, SMOLLM2_135M))
    with pytest.raises(
        RunError, match=r"without megatron-core installed \(pip install 'rljob\[megatron\]'\)"
    ):
        prepare(spec)


def test_a_global_batch_must_split_over_data_parallel_ranks() -> None:
    # The spec's rules refuse this for the spec's GPUs; a rank checks the world it was started in.
    with pytest.raises(ValueError, match="globalBatchSize 8 does not split over 3 data-parallel ranks"):
        check_layout(_spec(), SMOLLM2_135M, gpus=3)
    _, par = check_layout(_spec(gpus=3, pipeline=3), SMOLLM2_135M)  # 30 layers / 3 stages, dp 1
    assert (par.tp, par.pp, par.dp) == (1, 3, 1)


def test_prepare_names_every_unsupported_option() -> None:
    """The API server refuses these at admission (tests/spec_cases.py); a spec that skipped the
    models' validation (built in code) still meets the runtime's own refusal, naming each option."""
    with pytest.raises(ValueError, match=r"not supported by this runtime yet: .*parallelism.expert above 1"):
        _spec(training={"parallelism": {"expert": 2}})
    base = _spec()
    training = base.training.model_copy(  # model_copy skips validation: as a spec built in code
        update={
            "parallelism": base.training.parallelism.model_copy(
                update={"sequence_parallel": True, "expert": 2}
            ),
        }
    )
    spec = base.model_copy(update={"training": training})
    names = unsupported_options(spec)
    assert any("training.parallelism.expert above 1" in n for n in names)
    assert any("training.parallelism.sequenceParallel" in n for n in names)
    with pytest.raises(RunError, match=r"not supported by this runtime yet: .*parallelism.expert above 1"):
        prepare(spec)


def test_expert_parallelism_is_refused_at_admission_saying_expert_1_runs_moe() -> None:
    with pytest.raises(ValueError) as err:
        _spec(gpus=2, training={"parallelism": {"expert": 2}})
    message = str(err.value)
    assert "training.parallelism.expert above 1 (expert parallelism is not yet shown on GPUs" in message
    assert "builds MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral) at expert 1" in message


def test_prepare_names_the_expert_field_for_a_dense_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past admission (once it accepts expert > 1), a dense model meets the layout's refusal naming
    training.parallelism.expert."""
    from rljob_api import support

    field = ".training.parallelism.expert"
    monkeypatch.setattr(support, "LIMITS", tuple(lim for lim in support.LIMITS if lim.field != field))
    rules = tuple(rule for rule in RLTrainingJobSpec.rules if rule.field != field)
    monkeypatch.setattr(RLTrainingJobSpec, "rules", rules)
    base = _spec(gpus=2, path=_model(tmp_path, SMOLLM2_135M))
    par = base.training.parallelism.model_copy(update={"expert": 2})
    spec = base.model_copy(update={"training": base.training.model_copy(update={"parallelism": par})})
    with pytest.raises(RunError) as err:
        prepare(spec)
    assert str(err.value) == (
        "training.backend megatron: parallelism does not fit LlamaForCausalLM: training.parallelism.expert "
        "2 needs an MoE model (LlamaForCausalLM has no experts): set it to 1"
    )
