"""The weight transports' driving (``sync/``), with a recording trainer and rollout side: which
transport a job gets, what each one asks of the trainer and posts to the engines, in what order
(the IPC pipeline keeps two buckets alive at most), and how a relaunched engine is refreshed.
The byte layout: test_sync_buckets.py; the real engines: tests/integration and tests/gpu."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_runtime.sync import check_supported, choose_transport, make_transport
from rljob_runtime.sync.disk import DiskTransport, scratch_root, write_weights_dir
from rljob_runtime.sync.distributed import DistributedTransport
from rljob_runtime.sync.ipc import IpcTransport
from rljob_runtime.sync.nccl import BucketSpec
from rljob_runtime.sync.tensor import TensorTransport


def _spec(
    device: str = "cuda", colocate: bool = True, engine: str = "sglang", dtype: str = "bfloat16"
) -> RLTrainingJobSpec:
    return RLTrainingJobSpec.model_validate(
        {
            "model": {"path": "/unused", "dtype": dtype},
            "data": {"path": "/unused.jsonl"},
            "rollout": {"engine": engine, "batchSize": 2, "nSamplesPerPrompt": 4},
            "training": {"backend": "torch", "globalBatchSize": 8, "microBatchSize": 1},
            "resources": {
                "device": device,
                "colocate": colocate,
                "trainer": {"nodes": 1, "gpusPerNode": 1},
                **({} if colocate else {"rollout": {"gpus": 2}}),
            },
        }
    )


class Update:
    def __init__(self, log: list[Any], tp_sizes: dict[str, int]) -> None:
        self.log, self.tp_sizes, self.urls = log, tp_sizes, list(tp_sizes)
        self.live = list(tp_sizes)

    def post(self, path: str, body: Any) -> None:
        self.log.append(("post", path, {u: body(u) if callable(body) else body for u in self.live}))

    def post_each(
        self,
        path: str,
        bodies: Sequence[Any],
        *,
        collective: bool = False,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.log.append(("post_each", path, list(bodies), collective, on_lost))


class Rollout:
    def __init__(self, log: list[Any], tp_sizes: dict[str, int] | None = None) -> None:
        self.log = log
        self.tp = tp_sizes or {"http://a": 1, "http://b": 2}
        self.membership_epoch = 0

    @contextlib.contextmanager
    def updating(self, version: Any = None, *, only: str | None = None) -> Iterator[Update]:
        self.log.append(("updating", version, only))
        yield Update(self.log, {only: 3} if only else dict(self.tp))
        self.log.append(("updated",))

    def engine_tp_sizes(self) -> dict[str, int]:
        return dict(self.tp)

    def call_engines(self, path: str, bodies: dict[str, Any]) -> dict[str, Any]:
        self.log.append(("call", path, bodies))
        return {u: {"success": True} for u in bodies}


class Trainer:
    def __init__(self, log: list[Any], buckets: int = 3) -> None:
        self.log, self.buckets = log, buckets

    def named_tensors(self) -> dict[str, torch.Tensor]:
        self.log.append(("named",))
        return {"w": torch.ones(2, 2), "b": torch.zeros(3)}

    # disk: rank 0 writes on its own node (the real one: trainer/weight_source.py)
    def write_weights(self, directory: str | None, model_path: str | None) -> tuple[str, int]:
        self.log.append(("write", directory))
        return write_weights_dir(self.named_tensors(), directory, model_path)

    def remove_weights(self, directory: str) -> None:
        self.log.append(("remove", directory))
        shutil.rmtree(directory)

    # ipc
    def begin_ipc(self, max_bytes: int, codec: str, cast: str | None) -> tuple[int, int]:
        self.log.append(("begin_ipc", max_bytes, codec, cast))
        return self.buckets, 100 * self.buckets

    def ipc_bucket_async(self, index: int) -> str:
        self.log.append(("share", index))
        return f"ref{index}"

    def get(self, ref: str) -> str:
        return ref.replace("ref", "payload")

    def end_ipc(self) -> dict[str, float]:
        self.log.append(("end_ipc",))
        return {}

    # nccl
    def weight_group_address(self) -> tuple[str, int]:
        return "10.0.0.1", 1234

    def init_weight_update_group(self, address: str, port: int, world: int, name: str, backend: str) -> str:
        self.log.append(("init", world, name, backend))
        return "hosting"

    def wait(self, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        return [{"bytes": 24}] if refs == ["sending"] else [None]

    def weight_bucket_specs(self, max_bytes: int, cast: str | None) -> list[BucketSpec]:
        self.log.append(("specs", max_bytes, cast))
        return [BucketSpec(("w",), ("bfloat16",), ((2, 2),)), BucketSpec(("b",), ("bfloat16",), ((4,),))]

    def broadcast_weights(self, specs: list[BucketSpec]) -> list[str]:
        self.log.append(("broadcast", len(specs)))
        return ["sending"]

    def abort_weight_update_group(self) -> None:
        self.log.append(("abort",))

    def close_weight_update_group(self) -> None:
        self.log.append(("close",))


# ------------------------------------------------------------------------------------ the choice


def test_the_transport_follows_device_and_placement() -> None:
    assert choose_transport(_spec(), single_node=True) == "cuda_ipc"
    assert choose_transport(_spec(colocate=False), single_node=False) == "nccl"
    assert choose_transport(_spec(device="cpu", engine="hf"), single_node=True) == "disk"
    assert choose_transport(_spec(device="cpu", engine="hf"), single_node=False) == "tensors"
    check_supported(_spec(colocate=False), single_node=False)  # engines on their own GPUs: NCCL
    with pytest.raises(NotImplementedError, match=r"resources\.colocate true with more than 1"):
        check_supported(_spec(), single_node=False)


def test_make_transport_picks_the_codec_and_the_engines_dtype() -> None:
    ipc = make_transport(_spec(), single_node=True)
    assert isinstance(ipc, IpcTransport) and (ipc.codec, ipc.cast) == ("sglang", "bfloat16")
    hf = make_transport(_spec(engine="hf"), single_node=True)
    assert isinstance(hf, IpcTransport) and hf.codec == "rljob"
    nccl = make_transport(_spec(colocate=False), single_node=False, bucket_bytes=99, group_backend="gloo")
    assert isinstance(nccl, DistributedTransport) and (nccl.bucket_bytes, nccl.backend) == (99, "gloo")
    cpu = make_transport(_spec(device="cpu", engine="hf", dtype="float32"), single_node=False)
    assert isinstance(cpu, TensorTransport)
    assert isinstance(make_transport(_spec(), single_node=True, transport="disk"), DiskTransport)
    with pytest.raises(ValueError, match="positive"):
        IpcTransport("sglang", bucket_bytes=0)


# --------------------------------------------------------------------------------- CUDA IPC


def test_ipc_shares_the_next_bucket_while_the_engines_load_one() -> None:
    log: list[Any] = []
    metrics = IpcTransport("sglang", "bfloat16", bucket_bytes=123).push(Trainer(log), Rollout(log), 6)
    steps = [e[0] if e[0] != "share" else f"share{e[1]}" for e in log]
    assert steps == [
        "updating",
        "begin_ipc",
        "share0",
        "share1",  # asked for before bucket 0 is posted: flattened while the engines load bucket 0
        "post",
        "share2",  # asked for once bucket 0 was answered: rank 0 frees bucket 0 then (two alive at most)
        "post",
        "post",
        "end_ipc",
        "updated",
    ]
    assert log[1] == ("begin_ipc", 123, "sglang", "bfloat16")
    posts = [e for e in log if e[0] == "post"]
    first = posts[0][2]
    assert first["http://a"]["serialized_named_tensors"] == ["payload0"]
    assert first["http://b"]["serialized_named_tensors"] == ["payload0", "payload0"]  # one per TP rank
    assert first["http://a"]["load_format"] == "flattened_bucket"
    assert metrics["sync/buckets"] == 3 and metrics["sync/bytes"] == 300 and metrics["time/sync"] >= 0


def test_ipc_frees_the_export_when_the_engines_fail() -> None:
    log: list[Any] = []

    class Failing(Update):
        def post(self, path: str, body: Any) -> None:
            raise RuntimeError("engine refused")

    class FailingRollout(Rollout):
        @contextlib.contextmanager
        def updating(self, version: Any = None, *, only: str | None = None) -> Iterator[Update]:
            yield Failing(self.log, dict(self.tp))

    with pytest.raises(RuntimeError, match="refused"):
        IpcTransport("sglang").push(Trainer(log), FailingRollout(log), 2)
    assert log[-1] == ("end_ipc",)


def test_ipc_refresh_brings_one_engine_up_to_date() -> None:
    log: list[Any] = []
    IpcTransport("sglang").refresh(Trainer(log, buckets=1), Rollout(log), "http://new")
    assert log[0] == ("updating", None, "http://new")
    post = next(e for e in log if e[0] == "post")
    assert post[2] == {
        "http://new": {
            "serialized_named_tensors": ["payload0"] * 3,
            "load_format": "flattened_bucket",
            "flush_cache": False,
        }
    }


# ----------------------------------------------------------------------------- tensors and disk


def test_the_cpu_tensor_format_carries_the_whole_model_in_one_request() -> None:
    log: list[Any] = []
    metrics = TensorTransport().push(Trainer(log), Rollout(log), 3)
    post = next(e for e in log if e[0] == "post")
    assert post[1] == "/update_weights_from_tensor" and metrics["sync/bytes"] == (4 + 3) * 4
    from rljob_runtime import engine_api

    body = post[2]["http://a"]
    (data,) = body["serialized_named_tensors"]
    assert dict(engine_api.deserialize_named_tensors(data, None)).keys() == {"w", "b"}


def test_disk_has_the_trainer_write_on_its_node_and_a_relaunch_reloads_the_file(tmp_path: Path) -> None:
    """The trainer writes the file (on its own node: the driver may be on the Ray head) into one
    directory it chose on its first write; a relaunched engine loads that directory again; close
    has the trainer remove it."""
    from safetensors.torch import load_file

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    log: list[Any] = []
    disk = DiskTransport(str(model))
    disk.refresh(Trainer(log), Rollout(log), "http://new")  # nothing written yet: an export now
    assert ("write", None) in log
    log.clear()
    metrics = disk.push(Trainer(log), Rollout(log), 4)
    path = next(e for e in log if e[0] == "post")[2]["http://a"]["model_path"]
    assert ("write", path) in log and metrics["sync/bytes"] == (4 + 3) * 4
    assert set(load_file(str(Path(path) / "model.safetensors"))) == {"w", "b"}
    assert sorted(p.name for p in Path(path).iterdir()) == ["config.json", "model.safetensors"]
    log.clear()
    disk.refresh(Trainer(log), Rollout(log), "http://new")  # the directory holds the current version
    assert not any(e[0] in ("write", "named") for e in log)
    assert next(e for e in log if e[0] == "post")[2]["http://new"]["model_path"] == path
    disk.close()
    assert ("remove", path) in log and not Path(path).exists()


def test_a_trainer_that_is_gone_at_close_leaves_the_driver_to_remove_the_directory(tmp_path: Path) -> None:
    class Gone(Trainer):
        def remove_weights(self, directory: str) -> None:
            raise RuntimeError("the actor died")

    log: list[Any] = []
    disk = DiskTransport()
    disk.push(Gone(log), Rollout(log), 1)
    path = next(e for e in log if e[0] == "post")[2]["http://a"]["model_path"]
    disk.close()
    assert not Path(path).exists()


def test_a_trainer_that_never_answers_at_close_holds_it_up_no_longer_than_its_limit(tmp_path: Path) -> None:
    class Stuck(Trainer):
        def remove_weights(self, directory: str) -> None:
            threading.Event().wait()  # a rank stuck in a collective

    log: list[Any] = []
    disk = DiskTransport()
    disk.push(Stuck(log), Rollout(log), 1)
    path = next(e for e in log if e[0] == "post")[2]["http://a"]["model_path"]
    t0 = time.monotonic()
    disk.close(timeout_s=0.5)
    assert time.monotonic() - t0 < 5 and not Path(path).exists()


def test_the_scratch_directory_is_in_shm_only_when_it_has_room_for_two_copies(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    assert scratch_root(free // 4, shm=str(tmp_path)) == str(tmp_path)
    assert scratch_root(free, shm=str(tmp_path)) is None  # a pod's 64 MiB /dev/shm: the temp dir
    assert scratch_root(1, shm=str(tmp_path / "missing")) is None


# ------------------------------------------------------------------------------------------ NCCL


def test_the_group_is_built_once_and_rebuilt_after_a_relaunch_or_a_failure() -> None:
    log: list[Any] = []
    trainer, rollout = Trainer(log), Rollout(log)
    nccl = DistributedTransport("bfloat16", bucket_bytes=99)
    first = nccl.push(trainer, rollout, 1)
    init = next(e for e in log if e[0] == "init")
    assert init[1] == 1 + 1 + 2 and init[3] == "nccl"  # rank 0 + engine a's one rank + engine b's two
    joins = next(e for e in log if e[0] == "call")[2]
    assert joins["http://a"]["rank_offset"] == 1 and joins["http://b"]["rank_offset"] == 2
    each = next(e for e in log if e[0] == "post_each")
    assert each[1] == "/update_weights_from_distributed" and each[3] is True
    assert [b["names"] for b in each[2]] == [["w"], ["b"]]
    assert all(b["load_format"] == "flattened_bucket" for b in each[2])
    each[4]()  # on_lost aborts the trainer's side of the group
    assert log[-1] == ("abort",)
    assert first["sync/bytes"] == 24 and first["time/sync_group_init"] > 0 and first["sync/buckets"] == 2
    assert [e for e in log if e[0] == "specs"] == [("specs", 99, "bfloat16")]

    log.clear()
    second = nccl.push(trainer, rollout, 2)
    assert second["time/sync_group_init"] == 0.0 and not [e for e in log if e[0] in ("init", "specs")]

    log.clear()
    rollout.membership_epoch += 1  # an engine was relaunched
    nccl.push(trainer, rollout, 3)
    kinds = [e[0] if e[0] != "call" else e[1] for e in log]
    assert kinds[:4] == ["close", "/destroy_weights_update_group", "init", "/init_weights_update_group"]


def test_a_failed_broadcast_forces_a_new_group() -> None:
    log: list[Any] = []

    class Broken(Trainer):
        def wait(self, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
            if refs == ["sending"]:
                raise RuntimeError("aborted")
            return [None]

    trainer, rollout = Broken(log), Rollout(log)
    nccl = DistributedTransport()
    with pytest.raises(RuntimeError, match="aborted"):
        nccl.push(trainer, rollout, 1)
    log.clear()
    with pytest.raises(RuntimeError):
        nccl.push(trainer, rollout, 2)
    assert ("close",) in log and any(e[0] == "init" for e in log)


def test_a_relaunched_engine_gets_a_group_of_its_own() -> None:
    log: list[Any] = []
    trainer, rollout = Trainer(log), Rollout(log)
    nccl = DistributedTransport()
    nccl.push(trainer, rollout, 1)
    log.clear()
    nccl.refresh(trainer, rollout, "http://new")
    init = next(e for e in log if e[0] == "init")
    assert init[1] == 1 + 3  # the trainer and the new engine's three TP ranks
    joins = next(e for e in log if e[0] == "call" and e[1] == "/init_weights_update_group")[2]
    assert list(joins) == ["http://new"]
    assert ("close",) in log and log[-2][1] == "/destroy_weights_update_group"
    log.clear()
    nccl.push(trainer, rollout, 2)  # rank 0 hosts one group at a time: the shared one is rebuilt
    assert any(e[0] == "init" for e in log)


def test_an_engine_lost_mid_broadcast_does_not_fail_the_push() -> None:
    """The update drops the lost engine (it is replaced and refreshed); the trainer's aborted broadcast
    raises, which the transport expects, and the next push builds a new group."""
    log: list[Any] = []

    class Aborting(Trainer):
        def wait(self, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
            if refs == ["sending"] and ("abort",) in self.log:
                assert timeout_s is not None  # bounded: an abort that does not unblock must not hang
                raise RuntimeError("the weight broadcast was aborted")
            return super().wait(refs)

    class Losing(Update):
        def post_each(self, path: str, bodies: Sequence[Any], **kwargs: Any) -> None:
            self.lost = {"http://b": "connection reset"}
            kwargs["on_lost"]()

    class LosingRollout(Rollout):
        @contextlib.contextmanager
        def updating(self, version: Any = None, *, only: str | None = None) -> Iterator[Update]:
            yield Losing(self.log, dict(self.tp))

    trainer, rollout = Aborting(log), LosingRollout(log)
    nccl = DistributedTransport()
    metrics = nccl.push(trainer, rollout, 1)
    assert metrics["sync/engines_lost"] == 1 and metrics["sync/bytes"] == 0 and ("abort",) in log
    log.clear()
    nccl.push(trainer, rollout, 2)
    assert any(e[0] == "init" for e in log)
