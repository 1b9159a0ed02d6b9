"""tools/docs_words.py (make docs-check): the phrases about how the project was worked on fail with
their file, line and column; the legitimate uses of the same words pass.

The phrases below are written with a "~" inside their word, which ``_`` removes, so this file does not
match the check itself."""

from __future__ import annotations

from pathlib import Path

import docs_words
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _(text: str) -> str:
    return text.replace("~", "")


FLAGGED = [
    "## Ses~sion 14: Megatron at production size",
    "as measured in ses~sion-5",
    "Figures from sess~ions 4-6.",
    "No figure th~is ses~sion.",
    "what earlier ses~sions learned",
    "a devel~oper ses~sion has 30 minutes",
    "the ses~sion's budget ended here",
    "the operator at scale, third rou~nd of #20",
    "fourth rou~nd (#20)",
    "after #20's second rou~nd",
    "rou~nd 3 of #20",
    "two wo~rk rou~nds later",
    "R~2 made it faster",
    "on the le~nt H100s",
    "the dev~ice machine has no network",
    "see the dev~ice tool's README",
    "the dev~ice's limit is 600 s",
    "dev~ice time: about 13 minutes",
    "read bud~get_left_s first",
    "see KIN~DS.md",
    "call giv~e_back",
    "ran on nvidia-h~200-x2",
    "/wo~rk/.libr~ary/device/README.md",
    "/wo~rk/sha~red/reference/performance.md",
    "(sha~red/tools/sglang-kit/README.md)",
    "the to~ol library",
    "bash .gpu/sh/cal~l_18_a.sh",
    "the cal~l_1gpu_{a,b,c}.sh scripts",
    "picked from cal~l_1gpu_d's results",
    "a sub~agent wrote it",
    "a hel~per's GPU preparation",
    "two hel~pers' builds and tests running",
    "an ad-hoc script by a hel~per, not kept",
    "A hel~per ran the same test",
    "see the iss~ues note",
    "in the clos~ing note",
]

PASSES = [
    "async with aiohttp.ClientSession() as session:",
    "response = await _post(session, url, body)",
    '@pytest.fixture(scope="session")',
    "The session fixture `cluster` stops it at the end of the session.",
    "cp /tmp/ray/session_latest/logs/*.err",
    "subprocess.Popen(cmd, start_new_session=True)",
    "aiohttp caps a session at 100 connections; each session is closed",
    "operator_scale.py --jobs 300 --rounds 2",
    "| 300, round 1 / 2 | 15.3 / 17.7 s |",
    "# round 1: rows 0-5 -> 1, 3, 5 kept; round 2 asks for 2 rows",
    "Prompts to submit for the next round",
    "the device plugin and Ray set them",
    "Bytes of the group's storages on the device now",
    "left = ctx.budget_left(sample)",
    "the helpers append_model_turn / append_tool_turn",
    "Helpers for operator unit tests",
    "k8s.io/component-helpers v0.36.4",
    "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3",
    "what an R580 (CUDA 13.0) driver loads",
    "DeepSeek-R1 style reasoning",
    "k8s.io/kube-controller-manager v0.36.4/go.mod h1:R9+ehAzwHfk/FMEs5XYJ9gjl8pJAyEY/gt3Fp1ECB8w=",
    "excellent, equivalent, silent, prevalent",
    "a call_count of 3; recall_at_k",
    "/work/ckpt-sync",
    "2026-11-27, commit 6975ca1, 2 x H100 80GB, command: bash benchmarks/gpu/host/run.sh megatron",
]


@pytest.mark.parametrize("line", FLAGGED)
def test_the_phrase_is_flagged(line: str) -> None:
    text = _(line)
    found = docs_words.check_text("x.md", text)
    assert found, text
    assert all(f.path == "x.md" and f.line == 1 for f in found)


@pytest.mark.parametrize("line", PASSES)
def test_the_legitimate_use_passes(line: str) -> None:
    assert docs_words.check_text("x.py", line) == []


def test_a_finding_names_the_file_line_and_column_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.md"
    bad.write_text(_("# Notes\n\nAll fine here.\nMeasured in ses~sion 13 on two GPUs.\n"))
    good = tmp_path / "ok.md"
    good.write_text("An aiohttp session per manager.\n")
    assert docs_words.main([str(good)]) == 0
    assert docs_words.main([str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f'{bad}:4:13: "{_("ses~sion 13")}": ' in out
    assert str(good) not in out
    assert "1 finding(s)" in out


def test_a_phrase_wrapped_onto_the_next_line_is_found_at_its_start() -> None:
    found = docs_words.check_text("x.md", _("line one\nnothing more than th~is\nses~sion did.\n"))
    assert [(f.line, f.column, f.text) for f in found] == [(2, 19, _("th~is ses~sion"))]


def test_binary_and_missing_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(_("ses~sion 14\0").encode())
    (tmp_path / "latin.txt").write_bytes(_("ses~sion 14 \xe9").encode("latin-1"))
    assert docs_words.check_files(tmp_path, ["blob.bin", "latin.txt", "gone.md"]) == []


def test_the_check_and_this_test_do_not_match_themselves() -> None:
    assert docs_words.check_files(ROOT, ["tools/docs_words.py", "tests/unit/test_docs_words.py"]) == []


def test_every_rule_says_why_and_has_a_cheap_filter() -> None:
    for rule in docs_words.RULES:
        assert rule.why and rule.needs, rule.pattern.pattern
