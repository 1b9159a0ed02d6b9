"""Trainer ranks agree on a failed checkpoint write (checkpoint/agree.py, TorchTrainerRank.save): when one
rank cannot write, every rank raises CheckpointWriteError and none waits forever in a collective. Checked
in-process with a fake collective, then with two real gloo processes: an injected ENOSPC in
write_agreed, and a real failed torch.save (RLIMIT_FSIZE) inside the torch backend's save."""

from __future__ import annotations

import datetime
import errno
import json
import os
import resource
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from spawned_ranks import spawn_ranks

from rljob_runtime.checkpoint.agree import dist_failures, failures_by_all_reduce, write_agreed
from rljob_runtime.checkpoint.errors import CheckpointWriteError

# ------------------------------------------------------------------ one process, a fake collective


def collective(others_failed: Sequence[int], calls: list[bool], rank: int = 0) -> Callable[[bool], list[int]]:
    def failed(mine: bool) -> list[int]:
        calls.append(mine)
        return sorted({*others_failed, *([rank] if mine else [])})

    return failed


def enospc() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/ckpt/x.pt")


def test_success_everywhere_returns() -> None:
    calls: list[bool] = []
    write_agreed(lambda: None, collective([], calls), rank=0)
    assert calls == [False]


def test_the_failing_rank_raises_its_cause_after_the_collective() -> None:
    calls: list[bool] = []
    with pytest.raises(CheckpointWriteError) as caught:
        write_agreed(enospc, collective([], calls, rank=1), rank=1)
    assert calls == [True]  # it still met the others
    assert (
        str(caught.value)
        == "rank 1 failed to write its checkpoint files: [Errno 28] No space left on device: '/ckpt/x.pt'"
    )
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value.__cause__, OSError)


def test_the_other_ranks_raise_naming_the_failed_ones() -> None:
    calls: list[bool] = []
    with pytest.raises(
        CheckpointWriteError, match=r"^rank 1 failed to write checkpoint files \(rank 0 wrote its own\)$"
    ):
        write_agreed(lambda: None, collective([1], calls), rank=0)
    with pytest.raises(CheckpointWriteError, match=r"^ranks 1, 3 failed to write"):
        write_agreed(lambda: None, collective([3, 1], calls), rank=0)
    assert calls == [False, False]


def test_a_bug_still_meets_the_others_and_raises_as_itself() -> None:
    calls: list[bool] = []

    def bug() -> None:
        raise KeyError("optimizer")

    with pytest.raises(KeyError):
        write_agreed(bug, collective([], calls), rank=0)
    assert calls == [True]


def test_a_broken_collective_after_a_failed_write_reports_the_write() -> None:
    def broken(mine: bool) -> list[int]:
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(
        CheckpointWriteError, match=r"rank 0 failed to write its checkpoint files: .*No space"
    ):
        write_agreed(enospc, broken, rank=0)
    with pytest.raises(RuntimeError, match="Connection closed"):
        write_agreed(lambda: None, broken, rank=0)


def test_failures_by_all_reduce_sets_one_slot_per_rank() -> None:
    seen: list[list[int]] = []

    def all_reduce(flags: torch.Tensor) -> torch.Tensor:
        seen.append(flags.tolist())
        return flags + torch.tensor([1, 0, 0], dtype=flags.dtype)  # rank 0 failed elsewhere

    assert failures_by_all_reduce(all_reduce, 2, 3)(True) == [0, 2]
    assert seen == [[0, 0, 1]]
    assert dist_failures()(True) == [0] and dist_failures()(False) == []  # no group: this process alone


# ------------------------------------------------------------------ two gloo processes

TIMEOUT_S = 120.0  # a hang fails the test instead of the run


def _init(rank: int, port: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )


def _outcome(fn: Callable[[], None]) -> dict[str, Any]:
    try:
        fn()
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc), "errno": getattr(exc, "errno", None)}
    return {"type": None}


def _tiny_trainer_rank(rank: int, model_path: Path, world_size: int = 2) -> Any:
    """A TorchTrainerRank around a tiny random Llama (no spec, no download): what save() reads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rljob_runtime.trainer.torch_backend import TorchTrainerRank

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    torch.manual_seed(0)
    trainer = TorchTrainerRank.__new__(TorchTrainerRank)
    trainer.rank, trainer.world_size, trainer.device = rank, world_size, torch.device("cpu")
    trainer.model, trainer.model_path, trainer.step = LlamaForCausalLM(config), str(model_path), 3
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters())
    trainer.critic = trainer.critic_optimizer = None
    return trainer


def test_one_torch_trainer_rank_saves_and_reports_a_failed_write(tmp_path: Path) -> None:
    trainer = _tiny_trainer_rank(0, tmp_path / "source", world_size=1)
    trainer.save(str(tmp_path / "ok"))
    assert sorted(os.listdir(tmp_path / "ok")) == ["model", "trainer_rank0.pt"]
    (tmp_path / "blocked").write_text("a file where the directory should go")
    with pytest.raises(CheckpointWriteError, match=r"^rank 0 failed to write its checkpoint files: \[Errno"):
        trainer.save(str(tmp_path / "blocked"))


def _worker(rank: int, port: int, out: str, directory: str) -> None:
    """Both ranks: write_agreed with rank 1 out of space, then TorchTrainerRank.save (a good save,
    then one where rank 1's torch.save really fails); one outcome per scenario into out.<rank>."""
    _init(rank, port)
    results = {}
    write = enospc if rank == 1 else (lambda: None)
    results["agree fails"] = _outcome(lambda: write_agreed(write, dist_failures(), rank=rank))
    results["agree succeeds"] = _outcome(lambda: write_agreed(lambda: None, dist_failures(), rank=rank))
    trainer = _tiny_trainer_rank(rank, Path(directory) / "source")
    results["save succeeds"] = _outcome(lambda: trainer.save(f"{directory}/ok"))
    if rank == 1:  # rank 1's disk refuses files over 1 KiB: its torch.save fails for real
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    results["save fails"] = _outcome(lambda: trainer.save(f"{directory}/full"))
    if rank == 1:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    Path(f"{out}.{rank}").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One run of _worker on two gloo processes (spawning is the slow part): its directory and each
    rank's outcomes."""
    directory = tmp_path_factory.mktemp("two_ranks")
    (directory / "source").mkdir()
    (directory / "source" / "tokenizer_config.json").write_text("{}")
    out = directory / "result"
    spawn_ranks(_worker, str(out), str(directory), timeout_s=TIMEOUT_S)
    return directory, [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_two_gloo_ranks_agree_when_one_cannot_write(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    _, (rank0, rank1) = two_ranks
    assert rank0["agree fails"] == {
        "type": "CheckpointWriteError",
        "message": "rank 1 failed to write checkpoint files (rank 0 wrote its own)",
        "errno": None,
    }
    assert rank1["agree fails"] == {
        "type": "CheckpointWriteError",
        "message": "rank 1 failed to write its checkpoint files: [Errno 28] No space left on device: '/ckpt/x.pt'",
        "errno": errno.ENOSPC,
    }
    assert rank0["agree succeeds"] == rank1["agree succeeds"] == {"type": None}  # the group still works


@pytest.mark.slow
def test_torch_trainer_ranks_raise_together_when_one_really_fails_to_write(
    two_ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    directory, (rank0, rank1) = two_ranks
    assert rank0["save succeeds"] == rank1["save succeeds"] == {"type": None}
    assert sorted(os.listdir(directory / "ok")) == ["model", "trainer_rank0.pt", "trainer_rank1.pt"]
    assert (directory / "ok" / "model" / "tokenizer_config.json").is_file()
    assert rank0["save fails"]["type"] == rank1["save fails"]["type"] == "CheckpointWriteError"
    assert rank0["save fails"]["message"] == "rank 1 failed to write checkpoint files (rank 0 wrote its own)"
    # torch's zip writer fails with a RuntimeError; rank 1 names it
    assert rank1["save fails"]["message"].startswith("rank 1 failed to write its checkpoint files: "), rank1
    assert not (directory / "full" / "trainer_rank1.pt").exists()
    assert not (directory / "full" / "trainer_rank1.pt.tmp").exists()  # no partial file left
