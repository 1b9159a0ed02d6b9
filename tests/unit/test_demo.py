"""`make demo`'s pure parts: the adapted manifest, the live view, the reward curve, prerequisites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_demo import curve, manifest, prereqs
from rljob_demo.watch import Snapshot, View, clock

from rljob_api.resource import parse_document

REPO = Path(__file__).resolve().parents[2]


def example() -> dict[str, Any]:
    return yaml.safe_load((REPO / manifest.EXAMPLE).read_text())


def test_demo_job_is_the_example_with_local_paths(tmp_path: Path) -> None:
    job = manifest.demo_job(example(), repo=REPO, run_dir=tmp_path / "run1", ttl_seconds=5)
    spec = job["spec"]
    assert job["metadata"] == {"name": "grpo-cpu-demo", "namespace": "rljob-demo"}
    assert spec["data"]["path"] == str(REPO / "examples/data/add-1digit.jsonl")
    assert Path(spec["data"]["path"]).is_file()
    for dataset in spec["data"]["eval"]["datasets"]:
        assert Path(dataset["path"]).is_absolute() and Path(dataset["path"]).is_file()
    assert spec["checkpoint"]["path"] == str(tmp_path / "run1" / "checkpoints")
    assert manifest.tensorboard_dir(tmp_path / "run1") == tmp_path / "run1/checkpoints/tensorboard"
    assert spec["ttlSecondsAfterFinished"] == 5
    parse_document(job)  # still a valid RLTrainingJob
    # everything else is the example, unchanged; the example itself is not modified
    original = example()
    assert spec["rollout"] == original["spec"]["rollout"] and spec["training"] == original["spec"]["training"]
    assert original["spec"]["data"]["path"] == "examples/data/add-1digit.jsonl"


def test_demo_job_keeps_absolute_paths_and_the_example_ttl(tmp_path: Path) -> None:
    ex = example()
    ex["spec"]["data"]["path"] = "/data/x.jsonl"
    job = manifest.demo_job(ex, repo=REPO, run_dir=tmp_path)
    assert job["spec"]["data"]["path"] == "/data/x.jsonl"
    assert job["spec"]["ttlSecondsAfterFinished"] == ex["spec"]["ttlSecondsAfterFinished"]


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
    assert result.line() == "reward 0.30 (step 1) -> 0.90 (step 3); eval add-1digit 0.80 -> 0.80"
    assert curve.summarize({}) is None


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
    assert "needs 12 GB" in prereqs.check_disk(5, fresh=True)[0]
    assert prereqs.check_disk(5, fresh=False) == []
    assert prereqs.check_memory(None) == [] and prereqs.check_memory(4)[0].startswith("4.0 GB of memory")
