"""Atomic checkpoint saves (checkpoint/store.py): a save killed at any point, a full disk, a quota or an
I/O error never leaves a checkpoint that resume would load, keeps the previous one and says so; a
re-done step replaces its checkpoint safely; prune deletes the marker first; clean removes leftovers.
The failures are real where they can be: a process killed mid-write, writes refused by RLIMIT_FSIZE
inside torch.save and safetensors' save_file."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from rljob_runtime.checkpoint import store
from rljob_runtime.checkpoint.errors import CheckpointWriteError


def writer(payload: str) -> Callable[[Path], None]:
    """A `write` like the driver's: trainer files plus driver.json."""

    def write(directory: Path) -> None:
        (directory / "model").mkdir()
        (directory / "model" / "model.safetensors").write_text(payload)
        (directory / "trainer_rank0.pt").write_text(payload)
        store.write_driver_state(directory, {"step": payload})

    return write


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A checkpoint root holding a complete checkpoint of step 2."""
    directory = tmp_path / "ckpt"
    store.save(directory, 2, writer("two"), keep=0)
    return directory


def test_save_publishes_a_complete_directory(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    assert store.latest(root) is None
    final = store.save(root, 7, writer("seven"), keep=0)
    assert final == store.iteration_dir(root, 7) == root / "iter_0000007"
    assert sorted(p.name for p in final.iterdir()) == ["complete", "driver.json", "model", "trainer_rank0.pt"]
    assert store.latest(root) == (7, final)
    assert store.read_driver_state(final) == {"step": "seven"}
    assert store.model_dir(final).is_dir() and leftovers(root) == []


def test_save_writes_into_a_staging_directory_not_the_final_one(root: Path) -> None:
    seen: list[Path] = []

    def write(directory: Path) -> None:
        seen.append(directory)
        # while the trainer writes, resume still sees only step 2
        assert store.latest(root) == (2, store.iteration_dir(root, 2))
        assert not store.iteration_dir(root, 4).exists()

    store.save(root, 4, write, keep=0)
    assert seen == [root / ".staging-iter_0000004"]
    assert store.completed_steps(root) == [2, 4] and leftovers(root) == []


# ------------------------------------------------------------------ injected faults


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO], ids=["ENOSPC", "EDQUOT", "EIO"])
def test_a_failed_write_keeps_the_previous_checkpoint_and_says_so(root: Path, code: int) -> None:
    def write(directory: Path) -> None:
        (directory / "trainer_rank0.pt").write_bytes(b"partial")
        raise OSError(code, os.strerror(code))

    with pytest.raises(CheckpointWriteError) as caught:
        store.save(root, 4, write, keep=1)
    final = store.iteration_dir(root, 4)
    assert str(caught.value) == (
        f"checkpoint of step 4 not saved to {final}: [Errno {code}] {os.strerror(code)}; "
        "the previous checkpoint (step 2) is kept"
    )
    assert isinstance(caught.value, OSError) and caught.value.errno == code
    assert store.latest(root) == (2, store.iteration_dir(root, 2))
    assert store.read_driver_state(store.iteration_dir(root, 2)) == {"step": "two"}  # intact, not pruned
    assert not final.exists() and leftovers(root) == []


def test_a_failure_without_an_earlier_checkpoint_says_there_is_none(tmp_path: Path) -> None:
    def write(directory: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(CheckpointWriteError, match=r"step 1 not saved .*; there is no earlier checkpoint$"):
        store.save(tmp_path, 1, write, keep=0)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stage", ["marker", "fsync", "rename"])
def test_a_failure_after_the_write_also_keeps_the_previous_checkpoint(
    root: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    target = {"marker": (store, "mark_complete"), "fsync": (os, "fsync"), "rename": (os, "rename")}[stage]
    monkeypatch.setattr(*target, fail)
    with pytest.raises(CheckpointWriteError, match=r"step 4 not saved .*\[Errno 5\] Input/output error; "):
        store.save(root, 4, writer("four"), keep=1)
    monkeypatch.undo()
    assert store.completed_steps(root) == [2] and leftovers(root) == []


def test_a_bug_in_write_propagates_as_itself_and_leaves_nothing(root: Path) -> None:
    def write(directory: Path) -> None:
        (directory / "x").write_text("x")
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        store.save(root, 4, write, keep=0)
    assert store.completed_steps(root) == [2] and leftovers(root) == []


def test_filesystems_that_refuse_fsync_on_directories_still_save(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.save(root, 4, writer("four"), keep=0)
    assert store.completed_steps(root) == [2, 4]


def test_a_stale_staging_directory_of_the_same_step_is_replaced(root: Path) -> None:
    stale = store.staging_dir(root, 4)
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "junk").write_text("from a killed save")
    store.save(root, 4, writer("four"), keep=0)
    assert not (store.iteration_dir(root, 4) / "model" / "junk").exists() and leftovers(root) == []


# ------------------------------------------------------------------ replacing a step, prune, clean


def test_an_existing_checkpoint_of_the_same_step_is_replaced(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(root, 4, writer("old"), keep=0)
    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        renames.append((Path(src).name, Path(dst).name))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    store.save(root, 4, writer("new"), keep=0)
    # the old one is moved aside before the new one takes its name, and deleted after
    assert [r[0] for r in renames] == ["iter_0000004", ".staging-iter_0000004"]
    assert renames[0][1].startswith(".trash-iter_0000004-") and renames[1][1] == "iter_0000004"
    assert store.read_driver_state(store.iteration_dir(root, 4)) == {"step": "new"}
    assert store.completed_steps(root) == [2, 4] and leftovers(root) == []


def test_a_failed_replacement_puts_the_old_checkpoint_back(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(root, 4, writer("old"), keep=0)
    real_rename = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        if Path(src).name.startswith(".staging-"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(CheckpointWriteError, match=r"the previous checkpoint \(step 4\) is kept"):
        store.save(root, 4, writer("new"), keep=0)
    assert store.read_driver_state(store.iteration_dir(root, 4)) == {"step": "old"}
    assert leftovers(root) == []


def test_prune_keeps_the_newest_and_deletes_the_marker_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2, 3):
        store.save(tmp_path, step, writer(str(step)), keep=0)  # 0 keeps all
    assert store.completed_steps(tmp_path) == [1, 2, 3]
    markers_at_delete: list[bool] = []
    real_rmtree = store.shutil.rmtree

    def rmtree(path: str | Path, ignore_errors: bool = False) -> None:
        markers_at_delete.append((Path(path) / store.COMPLETE).exists())
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(store.shutil, "rmtree", rmtree)
    store.save(tmp_path, 4, writer("4"), keep=2)
    assert store.completed_steps(tmp_path) == [3, 4]
    assert markers_at_delete == [False, False]  # steps 1 and 2: marker gone before the tree


def test_a_prune_interrupted_mid_delete_leaves_nothing_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2):
        store.save(tmp_path, step, writer(str(step)), keep=0)
    monkeypatch.setattr(store.shutil, "rmtree", lambda *a, **k: None)  # the process dies right here
    assert store.prune(tmp_path, 1) == [1]
    monkeypatch.undo()
    assert (tmp_path / "iter_0000001" / "model").is_dir()  # files left, but no marker
    assert store.completed_steps(tmp_path) == [2]
    assert store.clean(tmp_path) == [tmp_path / "iter_0000001"]
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002"]


def test_clean_removes_every_leftover_and_nothing_else(root: Path) -> None:
    made = [
        store.staging_dir(root, 3),
        root / ".trash-iter_0000002-1-2",  # incomplete: its delete had begun
        root / "iter_0000003",  # no marker: an old-style interrupted save
    ]
    for path in made:
        (path / "model").mkdir(parents=True)
    (root / "notes.txt").write_text("not ours")
    assert store.clean(root) == sorted(made)
    assert sorted(os.listdir(root)) == ["iter_0000002", "notes.txt"]
    assert store.clean(root) == [] and store.clean(root / "missing") == []


def test_clean_restores_a_complete_checkpoint_caught_between_two_renames(root: Path) -> None:
    # a replacing save of step 2 died after moving the old one aside, before renaming the new one
    trash = root / ".trash-iter_0000002-1-2"
    store.iteration_dir(root, 2).rename(trash)
    (store.staging_dir(root, 2) / "model").mkdir(parents=True)
    assert store.latest(root) is None
    assert store.clean(root) == [store.staging_dir(root, 2)]
    assert store.latest(root) == (2, store.iteration_dir(root, 2)) and leftovers(root) == []


# ------------------------------------------------------------------ real crashes and real failed writes


def run_child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


KILLED_MID_WRITE = """
    import os, sys, time
    from pathlib import Path
    from rljob_runtime.checkpoint import store

    def write(directory: Path) -> None:
        with open(directory / "trainer_rank0.pt", "wb") as f:
            for i in range(256):  # up to 256 MiB: killed long before
                f.write(os.urandom(1 << 20))
                if i == 8:
                    f.flush()
                    print("mid-write", flush=True)
                    time.sleep(120)

    store.save(Path(sys.argv[1]), 4, write, keep=1)
"""


def test_a_save_killed_mid_write_is_never_loaded(root: Path) -> None:
    child = run_child(KILLED_MID_WRITE, str(root))
    try:
        assert child.stdout is not None and child.stdout.readline() == "mid-write\n", child.stderr
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    staging = store.staging_dir(root, 4)
    assert (staging / "trainer_rank0.pt").stat().st_size >= 9 << 20  # the partial file is there
    assert store.latest(root) == (2, store.iteration_dir(root, 2))
    assert store.clean(root) == [staging]
    store.save(root, 4, writer("four"), keep=1)
    assert store.completed_steps(root) == [4] and leftovers(root) == []


KILLED_AT = """
    import os, sys
    from pathlib import Path
    from rljob_runtime.checkpoint import store

    root, where = Path(sys.argv[1]), sys.argv[2]
    if where == "before-rename":
        store._install = lambda staging, final: os._exit(9)
    else:  # between the two renames of a replacing save
        real_rename = os.rename
        def rename(src, dst):
            if Path(src).name.startswith(".staging-"):
                os._exit(9)
            real_rename(src, dst)
        os.rename = rename

    def write(directory: Path) -> None:
        store.write_driver_state(directory, {"step": "new"})

    store.save(root, int(sys.argv[3]), write, keep=1)
"""


@pytest.mark.parametrize("where", ["before-rename", "between-renames"])
def test_a_save_killed_after_its_write_is_never_half_visible(root: Path, where: str) -> None:
    step = 4 if where == "before-rename" else 2  # the second replaces step 2
    child = run_child(KILLED_AT, str(root), where, str(step))
    _, err = child.communicate(timeout=120)
    assert child.returncode == 9, err
    if where == "before-rename":  # staging is complete, but not published
        assert (store.staging_dir(root, 4) / store.COMPLETE).exists()
        assert store.latest(root) == (2, store.iteration_dir(root, 2))
    else:  # the old step 2 is aside: nothing complete is visible until clean() puts it back
        assert store.latest(root) is None
    assert store.clean(root) == [store.staging_dir(root, step)]
    assert store.latest(root) == (2, store.iteration_dir(root, 2))
    assert store.read_driver_state(store.iteration_dir(root, 2)) == {"step": "two"}
    store.save(root, 4, writer("four"), keep=0)
    assert store.completed_steps(root) == [2, 4] and leftovers(root) == []


FILE_SIZE_LIMITED = """
    import resource, signal, sys
    from pathlib import Path
    import torch
    from safetensors.torch import save_file
    from rljob_runtime.checkpoint import store
    from rljob_runtime.checkpoint.errors import CheckpointWriteError

    root, kind = Path(sys.argv[1]), sys.argv[2]
    tensors = {"w": torch.zeros(1 << 16)}  # 256 KiB
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))

    def write(directory: Path) -> None:
        if kind == "torch.save":
            torch.save(tensors, directory / "trainer_rank0.pt")
        else:
            save_file(tensors, str(directory / "model.safetensors"))

    try:
        store.save(root, 4, write, keep=1)
    except CheckpointWriteError as exc:
        print(f"{type(exc.__cause__).__name__}|{exc}")
        sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["torch.save", "save_file"])
def test_a_really_failed_write_of_torch_or_safetensors_keeps_the_previous_checkpoint(
    root: Path, kind: str
) -> None:
    child = run_child(FILE_SIZE_LIMITED, str(root), kind)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 3, (out, err)
    cause, message = out.strip().split("|", 1)
    assert cause == {"torch.save": "RuntimeError", "save_file": "SafetensorError"}[kind]
    assert message.startswith(f"checkpoint of step 4 not saved to {store.iteration_dir(root, 4)}: ")
    assert message.endswith("; the previous checkpoint (step 2) is kept")
    if kind == "save_file":
        assert "File too large" in message
    assert store.latest(root) == (2, store.iteration_dir(root, 2)) and leftovers(root) == []


def test_is_write_failure_tells_write_errors_from_bugs() -> None:
    assert store.is_write_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert store.is_write_failure(CheckpointWriteError("rank 1 failed to write"))
    assert store.is_write_failure(
        RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598")
    )
    assert store.is_write_failure(
        RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    )
    assert not store.is_write_failure(
        RuntimeError("save on a trainer rank whose state is offloaded: onload() first")
    )
    assert not store.is_write_failure(ValueError("a bug"))


def test_an_error_from_a_ray_trainer_rank_is_reported_by_its_cause(root: Path) -> None:
    """The driver's write calls the ranks through Ray: ray.get raises RayTaskError(CheckpointWriteError),
    whose str() is the remote traceback; the message and errno come from the rank's own error."""
    exceptions = pytest.importorskip("ray.exceptions")

    def write(directory: Path) -> None:
        own = CheckpointWriteError("rank 1 failed to write its checkpoint files: [Errno 28] No space")
        own.errno = errno.ENOSPC
        raise exceptions.RayTaskError(
            "save", "Traceback (most recent call last): ...", own
        ).as_instanceof_cause()

    with pytest.raises(CheckpointWriteError) as caught:
        store.save(root, 4, write, keep=0)
    assert str(caught.value) == (
        f"checkpoint of step 4 not saved to {store.iteration_dir(root, 4)}: rank 1 failed to write its "
        "checkpoint files: [Errno 28] No space; the previous checkpoint (step 2) is kept"
    )
    assert caught.value.errno == errno.ENOSPC and leftovers(root) == []
