"""`make demo`'s pure parts: the job and volumes in real pods, the live view, the reward curve, prerequisites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_demo import curve, inpods, manifest, prereqs, runs
from rljob_demo.watch import Snapshot, View, clock

from rljob_api.images import VERSION
from rljob_api.resource import parse_document

REPO = Path(__file__).resolve().parents[2]


def example() -> dict[str, Any]:
    return yaml.safe_load((REPO / manifest.EXAMPLE).read_text())


def test_the_job_in_pods_reads_the_data_volume_and_checkpoints_to_its_run() -> None:
    job = inpods.job_in_pods(example(), namespace="rljob-demo", run="20261206-120000", ttl_seconds=5)
    spec = job["spec"]
    assert job["metadata"] == {"name": "grpo-cpu-demo", "namespace": "rljob-demo"}
    assert spec["model"]["path"] == "/data/model"
    assert spec["data"]["path"] == "/data/add-1digit.jsonl"
    assert [d["path"] for d in spec["data"]["eval"]["datasets"]] == ["/data/add-1digit-eval.jsonl"]
    assert spec["checkpoint"]["path"] == "/checkpoints"
    assert spec["checkpoint"]["volume"] == {
        "claimName": "rljob-demo-runs",
        "subPath": "20261206-120000/checkpoints",
    }
    assert spec["checkpoint"]["maxToKeep"] == example()["spec"]["checkpoint"]["maxToKeep"]
    res = spec["resources"]
    assert res["image"] == f"docker.io/rljob/runtime-cpu:{VERSION}"
    assert res["volumes"] == [
        {
            "name": "data",
            "mountPath": "/data",
            "readOnly": True,
            "persistentVolumeClaim": {"claimName": "rljob-demo-data"},
        }
    ]
    # Fits a node of two cores: the head half a core, the trainer no CPU amount (no limit).
    assert res["head"]["cpu"] == "500m" and "cpu" not in res["trainer"]
    assert res["trainer"]["memory"] == example()["spec"]["resources"]["trainer"]["memory"]
    assert spec["ttlSecondsAfterFinished"] == 5
    parse_document(job)  # still a valid RLTrainingJob
    original = example()  # everything else is the example's, and the example is not modified
    assert spec["rollout"] == original["spec"]["rollout"] and spec["training"] == original["spec"]["training"]
    assert original["spec"]["data"]["path"] == "examples/data/add-1digit.jsonl"
    without_ttl = inpods.job_in_pods(example(), namespace="x", run="r", ttl_seconds=None)
    assert without_ttl["spec"]["ttlSecondsAfterFinished"] == original["spec"]["ttlSecondsAfterFinished"]


def test_every_data_file_of_the_example_goes_onto_the_data_volume() -> None:
    files = inpods.data_files(example())
    assert files == ["examples/data/add-1digit.jsonl", "examples/data/add-1digit-eval.jsonl"]
    assert all((REPO / f).is_file() for f in files)


def test_the_volumes_are_local_to_the_real_node_and_bound_to_their_claims(tmp_path: Path) -> None:
    objs = inpods.volumes("ns1", tmp_path / "data", tmp_path / "runs")
    pvs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolume"}
    pvcs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
    assert set(pvs) == set(pvcs) == {"ns1-data", "ns1-runs"}
    assert pvs["ns1-data"]["spec"]["local"]["path"] == str(tmp_path / "data")
    assert pvs["ns1-runs"]["spec"]["local"]["path"] == str(tmp_path / "runs")
    for name, pv in pvs.items():
        assert pv["spec"]["claimRef"] == {"namespace": "ns1", "name": name}
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"  # never wipes this machine's files
        (term,) = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert term["matchExpressions"][0]["values"] == [inpods.NODE]
        assert pvcs[name]["spec"]["volumeName"] == name and pvcs[name]["metadata"]["namespace"] == "ns1"


def test_checkpoint_paths_in_the_pods_are_shown_as_this_machine_sees_them(tmp_path: Path) -> None:
    from rljob_demo import cli

    run = tmp_path / "runs" / "r1"
    assert cli.on_this_machine("/checkpoints/iter_0000010", run) == run / "checkpoints" / "iter_0000010"
    assert cli.on_this_machine(None, run) == run / "checkpoints"
    assert cli.on_this_machine("/elsewhere/iter_1", run) == Path("/elsewhere/iter_1")
    assert manifest.tensorboard_dir(run) == run / "checkpoints" / "tensorboard"
    settings = cli.Settings("c1", "rljob-demo", None, 1, 1)
    job = inpods.job_in_pods(example(), namespace="rljob-demo", run="r1", ttl_seconds=None)
    assert cli.run_dir_of(settings, job) == settings.state_dir / "runs" / "r1"


def snap(
    phase: str, step: str | None = None, reward: float | None = None, message: str = "", events=()
) -> Snapshot:
    row = f"grpo-cpu-demo   {phase:9} {step or '':6} {reward if reward is not None else '':6} 0   5s"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "message": message}]}
    if step:
        status["progress"] = {"stepText": step, "rewardMean": reward}
    return Snapshot(table=["NAME PHASE STEP REWARD GPUS AGE", row], status=status, events=list(events))


def event(uid: str, reason: str, message: str, count: int = 1) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "type": "Normal", "reason": reason, "message": message, "count": count}


def test_view_prints_the_header_once_and_rows_only_when_they_change() -> None:
    view = View()
    first = view.update(
        snap("Pending", message="creating", events=[event("a", "Pending", "New -> Pending")]), 0
    )
    assert first[0].startswith("TIME") and "NAME PHASE" in first[0]
    assert "event  Normal  Pending: New -> Pending" in first[1]
    assert first[2].startswith("0:00") and "Pending" in first[2]
    assert first[3].endswith("↳ creating")
    # same phase/step/reward, same message, same events (only AGE moved): nothing to print
    assert view.update(snap("Pending", message="creating", events=[event("a", "Pending", "x")]), 3) == []
    lines = view.update(snap("Running", "1/10", 0.34, message="step 1/10"), 65)
    assert len(lines) == 2 and lines[0].startswith("1:05") and "1/10" in lines[0]
    # a repeated event (count goes up) is new; the row is unchanged
    assert view.update(
        snap("Running", "1/10", 0.34, "step 1/10", [event("a", "Pending", "again", 2)]), 66
    ) == ["       event  Normal  Pending: again"]
    view.update(snap("Running", "2/10", 0.5), 70)
    view.update(snap("Succeeded", "10/10", 0.97), 300)
    assert view.phases == ["Pending", "Running", "Succeeded"]


def test_clock() -> None:
    assert clock(0) == "0:00" and clock(65.9) == "1:05" and clock(3600) == "60:00"


def scalars() -> dict[str, curve.Series]:
    return {
        "reward/mean": [(1, 0.3), (2, 0.6), (3, 0.9)],
        "eval/add-1digit/reward": [(3, 0.8)],
        "time/step": [(1, 10.0)],
    }


def test_summary_names_first_and_last_reward_and_each_eval() -> None:
    result = curve.summarize(scalars())
    assert result is not None
    assert (
        result.line()
        == "reward 0.30 (step 1) -> 0.90 (step 3); eval add-1digit 0.80 (step 3) -> 0.80 (step 3)"
    )
    assert curve.summarize({}) is None
    with_baseline = {**scalars(), "eval/add-1digit/reward": [(0, 0.2), (3, 0.8)]}
    result = curve.summarize(with_baseline)
    assert result is not None
    assert result.line().endswith("eval add-1digit 0.20 (before training) -> 0.80 (step 3)")


def test_reward_curve_png(tmp_path: Path) -> None:
    out = curve.plot_rewards(scalars(), tmp_path / "sub" / "reward.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_read_scalars_from_real_tensorboard_files(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    for step, value in [(1, 0.1), (2, 0.2), (2, 0.25)]:  # step 2 rewritten (a resumed run)
        writer.add_scalar("reward/mean", value, step)
    writer.close()
    assert curve.read_scalars(tmp_path)["reward/mean"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.25))]


def test_the_baseline_evaluation_is_step_0_of_the_runtimes_tensorboard_logs(tmp_path: Path) -> None:
    """ProgressReporter.baseline (data.eval.beforeTraining) as the demo's curve reads it."""
    import io

    from rljob_runtime.report import ProgressReporter

    stream = io.StringIO()
    reporter = ProgressReporter(2, job=None, tensorboard_dir=str(tmp_path), stream=stream)
    reporter.baseline({"add-1digit": 0.25})
    reporter.step(1, {"reward/mean": 0.5}, eval_rewards={"add-1digit": 0.75})
    reporter.close()
    assert "eval before training: add-1digit 0.2500" in stream.getvalue()
    summary = curve.summarize(curve.read_scalars(tmp_path))
    assert summary is not None
    assert (
        summary.line()
        == "reward 0.50 (step 1) -> 0.50 (step 1); eval add-1digit 0.25 (before training) -> 0.75 (step 1)"
    )


@pytest.mark.parametrize(
    ("version", "bad"), [((3, 11, 4), False), ((3, 12, 0), False), ((3, 10, 12), True), ((3, 8, 0), True)]
)
def test_python_version(version: tuple[int, ...], bad: bool) -> None:
    problems = prereqs.check_python(version)
    assert bool(problems) == bad
    if bad:
        assert "Python 3.11+" in problems[0] and "PYTHON=python3.11" in problems[0]


def test_go_is_needed_only_to_build() -> None:
    assert prereqs.check_go(None, None, (1, 26), cached=True) == []
    [missing] = prereqs.check_go(None, None, (1, 26), cached=False)
    assert "Go is needed once" in missing and "https://go.dev/dl/" in missing
    [old] = prereqs.check_go("/usr/bin/go", "go version go1.22.1 linux/amd64", (1, 26), cached=False)
    assert "go1.22.1" in old and "Go 1.26+" in old
    assert prereqs.check_go("/usr/bin/go", "go version go1.26.8 linux/amd64", (1, 26), cached=False) == []


def test_go_requirement_is_read_from_the_wrapper_module() -> None:
    need = prereqs.go_requirement(REPO / "tools/devcluster/gomod/go.mod")
    assert need >= (1, 21)


def test_disk_and_memory() -> None:
    assert prereqs.check_disk(50, fresh=True) == []
    assert "needs 25 GB" in prereqs.check_disk(5, fresh=True)[0]
    assert prereqs.check_disk(5, fresh=False) == []
    assert prereqs.check_memory(None) == [] and prereqs.check_memory(4)[0].startswith("4.0 GB of memory")


def test_the_real_node_needs_root() -> None:
    assert prereqs.check_root(0) == []
    [missing] = prereqs.check_root(1000)
    assert missing.startswith("root:") and "real pods" in missing


# ---- run directories and the disk -----------------------------------------------------------------


def make_run(runs_dir: Path, name: str, n_bytes: int) -> Path:
    run = runs_dir / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "weights").write_bytes(b"x" * n_bytes)
    return run


def test_prune_keeps_the_newest_runs_and_counts_what_it_freed(tmp_path: Path) -> None:
    old, middle, new = (make_run(tmp_path, f"2026112{d}-120000", 100 * d) for d in (1, 2, 3))
    (tmp_path / "notes").mkdir()  # not a run: never touched
    assert runs.list_runs(tmp_path) == [old, middle, new]
    removed, freed = runs.prune(tmp_path, 1)
    assert removed == [old, middle] and freed == 300
    assert runs.list_runs(tmp_path) == [new] and (tmp_path / "notes").is_dir()
    assert runs.prune(tmp_path, 1) == ([], 0)
    assert runs.prune(tmp_path, 0) == ([new], 300) and runs.list_runs(tmp_path) == []
    assert runs.list_runs(tmp_path / "missing") == [] and runs.prune(tmp_path / "missing", 0) == ([], 0)
    with pytest.raises(ValueError, match="keep must be >= 0"):
        runs.prune(tmp_path, -1)


@pytest.mark.parametrize(
    ("n_bytes", "text"), [(0, "0 B"), (999, "999 B"), (1500, "1.5 kB"), (3_100_000_000, "3.1 GB")]
)
def test_human_sizes(n_bytes: int, text: str) -> None:
    assert runs.human(n_bytes) == text


def test_keep_runs_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    from rljob_demo import cli

    assert cli.build_parser().parse_args(["up", "--keep-runs", "3"]).keep_runs == 3
    assert cli.build_parser().parse_args(["down", "--purge"]).purge
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--keep-runs", "0"])
    assert "must be at least 1, got 0" in capsys.readouterr().err


def test_the_demo_keeps_one_checkpoint_per_run() -> None:
    assert example()["spec"]["checkpoint"]["maxToKeep"] == 1


def test_the_local_object_store_holds_the_demo_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer ships the weights through Ray's object store at every sync; an object that does
    not fit goes to disk, which Ray refuses on a nearly full disk (what failed CI once)."""
    import math

    from gguf import GGUFReader

    from rljob_runtime.models.smollm2 import smollm2_gguf_path

    monkeypatch.syspath_prepend(str(REPO / "tools" / "devcluster"))
    import ray_local

    n_params = sum(math.prod(int(d) for d in t.shape) for t in GGUFReader(smollm2_gguf_path()).tensors)
    assert 130e6 < n_params < 140e6  # SmolLM2-135M
    fp32_bytes = 4 * n_params
    assert 1.5 * fp32_bytes <= ray_local.OBJECT_STORE_BYTES
    assert 0.95 < float(ray_local.LOCAL_FS_CAPACITY_THRESHOLD) < 1
