"""model.megatronCheckpoint is checked before Ray starts: a path that holds no torch_dist checkpoint
is refused with the field's name and what was found there. When the operator ran the megatron-cache
conversion job (RLJOB_MEGATRON_CACHE=1), prepare starts the trainer from its result in the model
cache, and refuses the job when that conversion is missing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rljob_api.contract import MEGATRON_CACHE_ENV
from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.models import megatron_cache
from rljob_runtime.prepare import check_megatron_checkpoint, prepare
from rljob_runtime.run_error import RunError

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_checkpoint_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(
        RunError, match=r"model\.megatronCheckpoint: no Megatron distributed checkpoint at .*does not exist"
    ):
        check_megatron_checkpoint(str(tmp_path / "nowhere"))


def test_a_directory_without_metadata_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunError, match=r"no metadata\.json there or in"):
        check_megatron_checkpoint(str(tmp_path))


def test_a_run_iteration_or_its_dist_directory_is_accepted(tmp_path: Path) -> None:
    dist = tmp_path / "iter_0000004" / "dist"
    dist.mkdir(parents=True)
    (dist / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    check_megatron_checkpoint(str(tmp_path / "iter_0000004"))
    check_megatron_checkpoint(str(dist))


# ------------------------------------------------------------------- the operator's conversion


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rljob_runtime.models.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def megatron_spec(model: Path, **model_fields: Any) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": str(model), "dtype": "bfloat16", **model_fields},
            "data": {"path": str(REPO / "examples/data/add-1digit.jsonl"), "applyChatTemplate": False},
            "rollout": {"engine": "hf", "batchSize": 2, "nSamplesPerPrompt": 4},
            "training": {"backend": "megatron", "globalBatchSize": 8, "microBatchSize": 1},
            "resources": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )


def fake_conversion(directory: Path, model: Path) -> Path:
    """What the conversion job leaves: a torch_dist checkpoint (its marker suffices here) and the record."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    megatron_cache.write_record(directory, megatron_cache.make_record(model, "0 mismatches"))
    return directory


def test_prepare_starts_from_the_operators_conversion(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLJOB_CACHE", str(tmp_path / "cache"))
    spec = megatron_spec(tiny_model)
    assert prepare(spec).spec.model.megatron_checkpoint is None  # not asked for: model.path's weights
    monkeypatch.setenv(MEGATRON_CACHE_ENV, "1")
    converted = fake_conversion(megatron_cache.converted_dir(tiny_model), tiny_model)
    prepared = prepare(spec)
    assert prepared.spec.model.megatron_checkpoint == str(converted)
    assert prepared.spec.model.path == spec.model.path and spec.model.megatron_checkpoint is None
    # The job's own model.megatronCheckpoint wins.
    own = fake_conversion(tmp_path / "own", tiny_model)
    mine = megatron_spec(tiny_model, megatronCheckpoint=str(own))
    assert prepare(mine).spec.model.megatron_checkpoint == str(own)


def test_prepare_refuses_a_missing_conversion_saying_what_to_do(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLJOB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(MEGATRON_CACHE_ENV, "1")
    converted = megatron_cache.converted_dir(tiny_model)
    message = (
        rf"the converted Megatron checkpoint of {re.escape(str(tiny_model.resolve()))} that the conversion "
        rf"job made is missing at {re.escape(str(converted))} \(removed from the model cache since\?\): "
        r"create the job again, and its conversion job converts the model again; or unset "
        r"resources\.modelCache"
    )
    with pytest.raises(RunError, match=message):
        prepare(megatron_spec(tiny_model))
    converted.mkdir(parents=True)  # a conversion that did not finish: no record
    (converted / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    with pytest.raises(RunError, match="is missing at"):
        prepare(megatron_spec(tiny_model))
