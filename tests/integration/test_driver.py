"""The whole loop on a local Ray: a random-weight tiny model, two hf engines behind the real
sglang-router, two torch trainer ranks (gloo), weight pushes after every step, checkpoints,
TensorBoard, resume. Colocated and disaggregated; dynamic sampling; ppo with a critic."""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rljob_api.resource import parse_spec
from rljob_api.status import EXIT_PREEMPTED
from rljob_runtime.checkpoint import store
from rljob_runtime.data.sample import Sample
from rljob_runtime.driver import RunOptions, run
from rljob_runtime.models.tiny_model import make_tiny_model
from rljob_runtime.prepare import prepare

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "add-1digit.jsonl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", arch="llama", seed=0)


def spec_for(model: Path, ckpt: Path, **resources: Any) -> Any:
    return parse_spec(
        {
            "model": {"path": str(model), "dtype": "float32"},
            "data": {"path": str(DATA), "applyChatTemplate": False},
            "rollout": {"engine": "hf", "batchSize": 4, "nSamplesPerPrompt": 2, "maxResponseLen": 8},
            "training": {
                "backend": "torch",
                "numRollout": 3,
                "globalBatchSize": 8,
                "microBatchSize": 2,
                "optimizer": {"lr": 1e-3},
            },
            "resources": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}, **resources},
            "reward": {"type": "math"},
            "checkpoint": {"path": str(ckpt), "saveInterval": 1, "maxToKeep": 2},
            "faultTolerance": {"engineHealthCheck": {"firstWaitSeconds": 60}},
        }
    )


@pytest.fixture
def one_ray_for_the_test(model_dir: Path, tmp_path: Path) -> Iterator[None]:
    """One local Ray for every run of the test, sized as the driver sizes its own: each run must give
    its bundles back (``Placement.release``), or the next cannot place its own."""
    import ray

    from rljob_runtime.placement import bundle_shapes, local_resources

    spec = spec_for(model_dir, tmp_path / "sizing")
    ray.init(
        num_cpus=len(bundle_shapes(spec)) + 2,
        resources=local_resources(spec),
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


def _live_placement_groups() -> list[str]:
    import ray

    return [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


def uninterrupted_batches(spec: Any, steps: int) -> list[list[int]]:
    """The prompt rows (group indices) of each step of an uninterrupted synchronous run: the run's
    own data source, from its start, one rollout batch a step (``RunResult.batches``)."""
    source = prepare(spec).source
    return [sorted({p.index for p in source.next_batch(spec.rollout.batch_size)}) for _ in range(steps)]


def test_colocated_loop_checkpoints_and_resumes_to_the_same_batches(
    model_dir: Path, tmp_path: Path, one_ray_for_the_test: None
) -> None:
    """A run stopped after step 1, then resumed: steps 2 and 3 train the prompts an uninterrupted
    run would have (none twice, none skipped); metrics each step, checkpoints kept by maxToKeep,
    TensorBoard, and the Ray bundles given back between the runs."""
    spec = spec_for(model_dir, tmp_path / "ckpt")
    first = run(prepare(spec), RunOptions(stop_after=1))
    assert first.steps_done == 1 and store.completed_steps(tmp_path / "ckpt") == [1]
    assert first.history[0]["train/ppo_kl"] == 0.0  # first step is on-policy
    assert _live_placement_groups() == []  # the next run reuses this Ray
    seen: list[dict[str, float]] = []
    rest = run(prepare(spec), RunOptions(tensorboard_dir=str(tmp_path / "tb"), on_step=seen.append))
    assert rest.steps_done == 3 and len(rest.history) == 2
    assert seen == rest.history  # each step's metrics as it ends
    for metrics in first.history + rest.history:
        assert {
            "reward/mean",
            "train/ppo_kl",
            "train/pg_loss",
            "time/sync",
            "response_length/mean",
        } <= metrics.keys()
        assert metrics["sync/bytes"] > 0
    assert store.completed_steps(tmp_path / "ckpt") == [2, 3]  # maxToKeep 2
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert first.batches + rest.batches == uninterrupted_batches(spec, 3)


def test_disaggregated_async_loop_with_two_rollouts_ahead_resumes_with_both(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One node would pick the shared-memory file transport; exercise the HTTP tensor one here.
    import rljob_runtime.sync

    monkeypatch.setattr(rljob_runtime.sync, "choose_transport", lambda spec, single_node=False: "tensors")

    def spec(ckpt: Path) -> Any:
        s = spec_for(model_dir, ckpt, colocate=False, rollout={"gpus": 2, "gpusPerNode": 2})
        s.rollout.async_.enabled = True
        s.rollout.async_.buffer_size = 2
        return s

    full = run(prepare(spec(tmp_path / "full")), RunOptions())
    assert full.steps_done == 3 and all(m["time/sync"] > 0 for m in full.history)
    # Step 1 trains on weights 0's rollout; step 2's was made while step 1 trained (before its push).
    staleness = [m["rollout/staleness_max"] for m in full.history]
    assert staleness[:2] == [0.0, 1.0] and max(staleness) <= 2.0
    # How many rollouts are ahead at step 1's checkpoint is a race: when step 1's training ends before
    # step 2's rollout is made, the checkpoint waits for it and step 3's never started (one saved,
    # rightly). The case under test is two ahead: step 1 ends only once the producer holds both.
    train_when_rollouts_ahead_are_full(monkeypatch)
    first = run(prepare(spec(tmp_path / "resumed")), RunOptions(stop_after=1))
    # The checkpoint holds the rollouts of steps 2 and 3, made while step 1 trained.
    state = store.read_driver_state(store.iteration_dir(tmp_path / "resumed", 1))
    assert [len(b["samples"]) for b in state["rollout_buffers"]] == [8, 8]
    rest = run(prepare(spec(tmp_path / "resumed")), RunOptions())
    assert first.batches + rest.batches == full.batches


def train_when_rollouts_ahead_are_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each training step of the next run ends only once its async rollout producer holds bufferSize
    rollouts (or has none left to make): what the rollouts ahead are at a checkpoint no longer depends
    on how fast this machine generates and trains."""
    import rljob_runtime.driver as driver
    import rljob_runtime.rollouts_ahead as rollouts_ahead

    producers: list[Any] = []

    class Recorded(rollouts_ahead.RolloutsAhead):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            producers.append(self)

        def wait_full(self, timeout: float) -> bool:
            with self._cond:
                return self._cond.wait_for(
                    lambda: (
                        len(self._ready) >= self.depth
                        or self._error is not None
                        or (self._left == 0 and not self._making)
                    ),
                    timeout,
                )

    train = driver._train

    def train_then_wait(*args: Any, **kwargs: Any) -> Any:
        metrics = train(*args, **kwargs)
        assert producers[-1].wait_full(600), "the rollout producer did not fill its buffer in 600 s"
        return metrics

    monkeypatch.setattr(rollouts_ahead, "RolloutsAhead", Recorded)
    monkeypatch.setattr(driver, "_train", train_then_wait)


class OddPromptsSignal:
    """A reward where only odd prompt rows can be learned from: their groups score [1, 0, ...], the
    even rows' groups all 0 (zero variance: dynamic sampling drops them)."""

    async def score(self, samples: list[Sample]) -> list[float]:
        for position, sample in enumerate(samples):
            odd = (sample.group_index or 0) % 2 == 1
            sample.reward = 1.0 if odd and position % 2 == 0 else 0.0
        return [float(s.reward) for s in samples]  # type: ignore[arg-type]


def test_async_dynamic_sampling_trains_on_groups_with_signal_and_resumes(
    model_dir: Path, tmp_path: Path
) -> None:
    spec = spec_for(model_dir, tmp_path / "ckpt", colocate=False, rollout={"gpus": 2, "gpusPerNode": 2})
    spec.training.num_rollout = 2
    spec.rollout.async_.enabled = True
    spec.algorithm.dynamic_sampling.enabled = True
    spec.algorithm.dynamic_sampling.over_sampling_batch_size = 8
    spec.algorithm.dynamic_sampling.max_rounds = 8

    def prepared() -> Any:
        p = prepare(spec)
        p.reward = OddPromptsSignal()  # scored one group at a time: group positions are samples' positions
        return p

    first = run(prepared(), RunOptions(stop_after=1))
    state = store.read_driver_state(store.iteration_dir(tmp_path / "ckpt", 1))
    # step 2's rollout, made while step 1 trained
    buffered = [Sample.from_dict(d) for d in state["rollout_buffers"][0]["samples"]]
    rest = run(prepared(), RunOptions())
    assert rest.steps_done == 2
    history = first.history + rest.history
    for metrics, groups in zip(history, first.batches + rest.batches, strict=True):
        assert (
            metrics["dynamic_sampling/groups_kept"] == 4 and metrics["dynamic_sampling/groups_trained"] == 4
        )
        assert len(groups) == 4 and all(g % 2 == 1 for g in groups)  # every trained group has variance
        assert metrics["reward/mean"] == 0.5  # each kept group scores [1, 0]
        assert metrics["train/tokens"] > 0
    assert sum(m["dynamic_sampling/groups_dropped"] for m in history) > 0
    assert rest.batches[0] == sorted({s.group_index for s in buffered})  # the buffered rollout, as saved
    assert all(s.reward is not None for s in buffered) and len(buffered) == 8
    assert rest.history[0]["dynamic_sampling/groups_kept"] == 4  # its metrics came back with it


def test_ppo_with_a_critic_checkpoints_and_resumes(model_dir: Path, tmp_path: Path) -> None:
    spec = spec_for(model_dir, tmp_path / "ckpt")
    spec.training.num_rollout = 2
    spec.algorithm.advantage_estimator = "ppo"
    spec.algorithm.critic.lr = 1e-3

    def prepared() -> Any:
        p = prepare(spec)
        p.reward = OddPromptsSignal()  # the random model never answers right: give the critic a target
        return p

    first = run(prepared(), RunOptions(stop_after=1))
    assert (store.iteration_dir(tmp_path / "ckpt", 1) / "critic" / "model.safetensors").is_file()
    rest = run(prepared(), RunOptions())
    assert first.steps_done == 1 and rest.steps_done == 2 and len(rest.history) == 1
    for metrics in first.history + rest.history:
        for key in ("train/value_loss", "train/value_clipfrac", "train/value_explained_var", "train/pg_loss"):
            assert math.isfinite(metrics[key]), key
        assert metrics["train/value_loss"] > 0
    assert first.history[0]["train/ppo_kl"] == 0.0 and first.history[0]["train/value_clipfrac"] == 0.0
    assert (store.iteration_dir(tmp_path / "ckpt", 2) / "critic" / "model.safetensors").is_file()


def test_bad_config_fails_before_ray_starts(model_dir: Path, tmp_path: Path) -> None:
    import ray

    spec = spec_for(model_dir, tmp_path / "ckpt")
    spec.data.path = str(tmp_path / "missing.jsonl")
    with pytest.raises(Exception, match=r"missing\.jsonl"):
        prepare(spec)
    assert not ray.is_initialized()


_MARKERS = (
    "rljob_runtime.rollout.hf_server",
    "sglang_router",
    "raylet",
    "gcs_server",
    "ray::",
    "default_worker.py",
)


class RunProcesses:
    """The processes one run starts (engines, the router, Ray's daemons and workers), told apart from
    another test's beside it (a second pytest-xdist worker): the run's descendants seen while it runs,
    and any process whose environment holds the run's tag (inherited from the run; Ray's agents
    rewrite theirs, so the descendants are needed too). Each is known by pid and start time, so a
    pid used again by another process is not taken for it."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex
        self.seen: dict[tuple[int, float], str] = {}

    def env(self) -> dict[str, str]:
        return {**os.environ, "RLJOB_TEST_RUN": self.tag}

    def look(self, root: int) -> dict[tuple[int, float], str]:
        """Record the run's processes alive now (``root``: the run's own process); returns them."""
        import psutil

        try:
            descendants = {p.pid for p in psutil.Process(root).children(recursive=True)}
        except psutil.Error:
            descendants = set()
        now = {}
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            try:
                cmd = " ".join(proc.info["cmdline"] or [])
                if not any(m in cmd for m in _MARKERS):
                    continue
                if (
                    proc.pid in descendants
                    or self.tag.encode() in Path(f"/proc/{proc.pid}/environ").read_bytes()
                ):
                    now[(proc.pid, proc.info["create_time"])] = cmd
            except (psutil.Error, OSError):
                continue
        self.seen.update(now)
        return now

    def alive(self, root: int) -> dict[tuple[int, float], str]:
        """Those recorded (or tagged) processes still running."""
        import psutil

        self.look(root)
        left = {}
        for (pid, started), cmd in self.seen.items():
            try:
                if psutil.Process(pid).create_time() == started:
                    left[(pid, started)] = cmd
            except psutil.Error:
                continue
        return left


def test_a_sigterm_finishes_the_step_saves_it_and_the_resumed_run_trains_the_same_batches(
    model_dir: Path, tmp_path: Path
) -> None:
    """A preemption (SIGTERM) in the middle of step 2: the step finishes, a checkpoint of it is
    written although saveInterval would not save it, and the resumed run trains exactly the batches
    the uninterrupted run trained after it: none twice, none skipped."""
    import os
    import signal
    import threading

    from rljob_runtime import preemption

    def spec(ckpt: Path) -> Any:
        doc = spec_for(model_dir, ckpt).to_document()
        doc["training"]["numRollout"] = 5
        doc["checkpoint"]["saveInterval"] = 100  # only the last step's save, and the preemption's
        return parse_spec(doc)

    def sigterm_in_step_2(metrics: dict[str, float]) -> None:
        if metrics["step"] == 1:  # step 2 starts as this returns
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()

    before = signal.getsignal(signal.SIGTERM)
    preemption.reset()
    try:
        first = run(prepare(spec(tmp_path / "preempted")), RunOptions(on_step=sigterm_in_step_2))
        assert first.preempted and 2 <= first.steps_done < 5, first
        assert not preemption.current().interrupted
        assert store.completed_steps(tmp_path / "preempted") == [first.steps_done]
        assert first.last_checkpoint == str(store.iteration_dir(tmp_path / "preempted", first.steps_done))
        assert preemption.current().finished  # the next run in this process starts afresh
        rest = run(prepare(spec(tmp_path / "preempted")), RunOptions())
    finally:
        signal.signal(signal.SIGTERM, before)
        preemption.reset()
    assert not rest.preempted and rest.steps_done == 5
    assert [h["step"] for h in rest.history] == list(range(first.steps_done + 1, 6))
    # the preemption's checkpoint and the last step's: saveInterval saved none between
    assert store.completed_steps(tmp_path / "preempted") == [first.steps_done, 5]
    assert first.batches + rest.batches == uninterrupted_batches(spec(tmp_path / "preempted"), 5)


def test_sigterm_mid_run_exits_preempted_with_a_checkpoint_and_leaves_no_orphans(
    model_dir: Path, tmp_path: Path
) -> None:
    import signal
    import subprocess
    import sys
    import time

    import yaml

    spec = spec_for(model_dir, tmp_path / "ckpt").to_document()
    spec["training"]["numRollout"] = 200
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "rljob.dev/v1alpha1",
                "kind": "RLTrainingJob",
                "metadata": {"name": "t"},
                "spec": spec,
            }
        )
    )
    run_processes = RunProcesses()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rljob_runtime.cli",
            "train",
            "-c",
            str(config),
            "--tensorboard",
            str(tmp_path / "tb"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**run_processes.env(), "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.lstrip("[ ").startswith("1/200") or time.monotonic() > deadline:
            break
    assert any(line.lstrip("[ ").startswith("1/200") for line in lines), "".join(lines[-30:])
    assert run_processes.look(proc.pid), "the run started no engine or Ray process"
    proc.send_signal(signal.SIGTERM)  # preempted: the step in flight finishes and is saved
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, out[-2000:]
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"rljob-runtime: preempted after step (\d+); the job resumes from its checkpoint .+", last
    )
    assert store.completed_steps(tmp_path / "ckpt")[-1] == int(last.split()[4].rstrip(";"))
    deadline = time.monotonic() + 30
    while (left := run_processes.alive(proc.pid)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"orphans: {left}"


def test_unsupported_options_are_refused_by_name(model_dir: Path, tmp_path: Path) -> None:
    from rljob_runtime.run_error import RunError

    valid = spec_for(model_dir, tmp_path / "ckpt", colocate=False, rollout={"gpus": 2, "gpusPerNode": 2})
    # The API refuses these at admission; a spec built in code (model_copy skips validation) still
    # meets the runtime's own refusal.
    training = valid.training.model_copy(
        update={
            "parallelism": valid.training.parallelism.model_copy(update={"sequence_parallel": True}),
            "megatron_args": {"x": "1"},
        }
    )
    with pytest.raises(
        RunError, match=r"training\.megatronArgs .*; .*training\.parallelism\.sequenceParallel"
    ):
        prepare(valid.model_copy(update={"training": training}))
    spec = valid
    spec.rollout.async_.enabled = True
    spec.algorithm.dynamic_sampling.enabled = True
    spec.rollout.n_samples_per_prompt = 1
    with pytest.raises(RunError, match=r"dynamicSampling needs rollout\.nSamplesPerPrompt >= 2"):
        prepare(spec)


def test_partial_rollout_continues_aborted_groups_and_resumes_with_them(
    model_dir: Path, tmp_path: Path
) -> None:
    """Real hf engines decoding 2 requests at a time: over-sampled groups still queued or decoding
    when a step has its 2 groups are aborted, carried (with the tokens they had), continued first in
    the next step under the new weights, and kept across a stop and resume."""

    def spec() -> Any:
        s = spec_for(model_dir, tmp_path / "ckpt", colocate=False, rollout={"gpus": 2, "gpusPerNode": 2})
        s.rollout.batch_size, s.rollout.max_response_len = 2, 96
        s.training.global_batch_size, s.training.num_rollout = 4, 3
        s.rollout.sglang_args = {"max-running-requests": "2"}
        s.algorithm.dynamic_sampling.enabled = True
        s.algorithm.dynamic_sampling.over_sampling_batch_size = 8
        # over-sampling only (every group passes), answered late so the abort finds tokens to carry
        s.rollout.custom_filter = "group_filters:keep_all_after_a_pause"
        s.rollout.partial_rollout = True
        s.rollout.mask_off_policy_partial_tokens = True
        return s

    first = run(prepare(spec()), RunOptions(stop_after=2))
    state = store.read_driver_state(store.iteration_dir(tmp_path / "ckpt", 2))
    saved = [[Sample.from_dict(d) for d in group] for group in state["partial_groups"]]
    rest = run(prepare(spec()), RunOptions())
    history = first.history + rest.history
    assert rest.steps_done == 3 and len(history) == 3
    assert all(m["partial/groups_carried"] > 0 for m in history)  # 2 of 8 groups were needed
    assert history[0]["partial/groups_continued"] == 0
    assert history[1]["partial/groups_continued"] == history[0]["partial/groups_carried"]
    assert sum(m["partial/tokens_carried"] for m in history) > 0  # some were cut mid-response
    assert saved and len(saved) == history[1]["partial/groups_carried"]
    assert rest.history[0]["partial/groups_continued"] == len(saved)  # the resumed run took them first
    for metrics in history:
        assert metrics["dynamic_sampling/groups_trained"] == 2
        # a continued response mixes the version that started it and the one that finished it
        assert (metrics["partial/tokens_masked"] > 0) == (metrics["rollout/mixed_version_samples"] > 0)
    # (nearest completion first: carried.py; not every step, a step may train two groups carried whole)
    assert sum(m["rollout/mixed_version_samples"] for m in history[1:]) > 0
