"""Fail on words that tell how the project was worked on instead of what it is.

    python tools/docs_words.py             # make docs-check: every text file git knows (tracked or new)
    python tools/docs_words.py FILE...     # only these files

The repository states facts about the project: a benchmark is a date, a commit, the hardware and the
command; a GPU run happens on a GPU host. It does not number the stretches of work that built it,
name the machines or tools of the environment it was developed in, keep the scripts of single past
GPU runs, or say which person or AI assistant did a piece of work. Each rule below is one such phrase,
as precise as its legitimate neighbours need: an HTTP or aiohttp session, Ray's ``session_latest``
directory, pytest's session scope, a benchmark's ``--rounds`` and dynamic sampling's rounds, the CUDA
device, the runtime's ``budget_left()`` and helper functions all pass.

A phrase may wrap onto the next line. Every finding prints as ``path:line:column: "text": why``,
and the exit status is then 1. Each pattern brackets one letter of its word (``[s]ession``), so the
list below never matches itself.
"""

from __future__ import annotations

import argparse
import bisect
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
_NUMBERED = "numbers a stretch of the project's development: give the date and commit of what it says"
_ENVIRONMENT = "names the development environment: name the hardware or the project's own files"
_WHO = "says who did the work (an AI assistant): say what was done"


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    why: str
    # The rule runs on a text only when its lowercased form holds one of these (a cheap filter)
    needs: tuple[str, ...]


def _rule(regex: str, why: str, *, case: bool = False) -> Rule:
    """``regex``'s bracketed letters (``[s]ession``) give the words a text needs to contain to match."""
    needs = {
        (m.group(1) + (m.group(2)[:-1] if m.group(3) else m.group(2))).lower()
        for m in re.finditer(r"\[(\w)\](\w*)(\?)?", regex)
    }
    return Rule(re.compile(regex, 0 if case else re.IGNORECASE), why, tuple(sorted(needs)))


RULES: tuple[Rule, ...] = (
    # -- numbered or referred-to sessions of work ----------------------------------------------------
    _rule(r"\b[s]essions?[ -]\d+", _NUMBERED),
    _rule(
        r"\b(?:this|that|earlier|previous|prior|next|later|same|whole|developer|work|working|coding)"
        r"\s+[s]essions?\b",
        _NUMBERED,
    ),
    _rule(r"\b[s]ession's\s+(?:budget|device|\d)", _NUMBERED),
    _rule(r"\b[s]essions'", _NUMBERED),
    # -- numbered rounds on an issue -----------------------------------------------------------------
    _rule(
        rf"\b(?:{_ORDINAL}|next|last|previous|earlier|this|that)\s+[r]ound\s*(?:of\s+|\(\s*|,\s*)#\d+",
        _NUMBERED,
    ),
    _rule(r"#\d+'s\s+(?:\w+\s+)?[r]ounds?\b", _NUMBERED),
    _rule(r"\b[r]ound\s+\d+\s+(?:of\s+|\(\s*)#\d+", _NUMBERED),
    _rule(r"\b(?:work|working|development|review)\s+[r]ounds?\b", _NUMBERED),
    _rule(r"\b[r]ounds?\s+of\s+(?:work|development|review)\b", _NUMBERED),
    _rule(r"(?<![-\w:/+=])[R][1-9]\d?\b(?![-.+/=]?\w)", _NUMBERED + " (an R<n> label)", case=True),
    # -- the development environment's machines and tools --------------------------------------------
    _rule(r"\b[l]ent\b", _ENVIRONMENT),
    _rule(r"\b[d]evice\s+machines?\b", _ENVIRONMENT),
    _rule(r"\b[d]evice(?:'s)?\s+(?:tool|calls?|README|budget|limit)\b", _ENVIRONMENT),
    _rule(r"\b[d]evice[- ]time\b", _ENVIRONMENT + " (a GPU kernel's time is GPU time)"),
    _rule(r"\b[b]udget_left(?:_s)?\b(?!\s*\()", _ENVIRONMENT),
    _rule(r"\b[K]INDS\.md\b|\b[g]ive_back\b", _ENVIRONMENT, case=True),
    _rule(r"\bnvidia-[h]\d+(?:-x\d+)?\b", _ENVIRONMENT, case=True),
    _rule(r"/[w]ork/(?:\.library|shared)\b|\.[l]ibrary/", _ENVIRONMENT),
    _rule(r"\b[s]hared/(?:tools|reference)/", _ENVIRONMENT),
    _rule(r"\b[t]ool\s+library\b", _ENVIRONMENT),
    # -- scripts of single past GPU runs -------------------------------------------------------------
    _rule(
        r"\b[c]all_[\w{},*]*\.sh\b|\b[c]all_\d\w*",
        "a past run's script: benchmarks/gpu/host/run.sh SUITE runs the suites",
    ),
    # -- who did the work ---------------------------------------------------------------------------
    _rule(r"\b[s]ubagents?\b", _WHO),
    _rule(r"\b[h]elpers?(?:'s|')\s+(?:work|e2e|builds?|GPU|preparation|runs?|tests?|changes?)\b", _WHO),
    _rule(
        r"\b(?:by|from|with)\s+(?:a|the|another|one)\s+[h]elper\b"
        r"(?!\s*(?:function|method|module|script|class|\())",
        _WHO,
    ),
    _rule(
        r"\b(?:a|another|one|the)\s+[h]elper\s+(?:ran|wrote|found|did|made|measured|built|checked)\b", _WHO
    ),
    _rule(r"\b[i]ssues?\s+note\b|\b[c]losing\s+note\b", _WHO),
)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    column: int
    text: str
    why: str

    def __str__(self) -> str:
        return f'{self.path}:{self.line}:{self.column}: "{self.text}": {self.why}'


def check_text(path: str, text: str) -> list[Finding]:
    """Every rule's matches in ``text`` (a match may span lines), ordered by line and column."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    lower = text.lower()
    found: list[Finding] = []
    for rule in RULES:
        if rule.needs and not any(word in lower for word in rule.needs):
            continue
        for m in rule.pattern.finditer(text):
            line = bisect.bisect_right(starts, m.start())
            column = m.start() - starts[line - 1] + 1
            found.append(Finding(path, line, column, " ".join(m.group(0).split()), rule.why))
    return sorted(found, key=lambda f: (f.line, f.column))


def read_text(path: Path) -> str | None:
    """The file as text, or None for a binary file (a NUL byte, or not UTF-8) or one that is gone."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def repo_files(root: Path) -> list[str]:
    """Tracked files and new files git does not ignore, relative to ``root``."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def check_files(root: Path, paths: Iterable[str]) -> list[Finding]:
    found: list[Finding] = []
    for rel in paths:
        text = read_text(root / rel)
        if text is not None:
            found.extend(check_text(rel, text))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fail on words about how the project was worked on.")
    parser.add_argument("files", nargs="*", help="files to check (default: every file git knows)")
    args = parser.parse_args(argv)
    found = check_files(Path.cwd(), args.files) if args.files else check_files(ROOT, repo_files(ROOT))
    for finding in found:
        print(finding)
    if found:
        print(f"{len(found)} finding(s): state facts about the project instead (tools/docs_words.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
