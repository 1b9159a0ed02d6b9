"""model.megatronCheckpoint is checked before Ray starts: a path that holds no torch_dist checkpoint
is refused with the field's name and what was found there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rljob_runtime.driver import RunError, check_megatron_checkpoint


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
