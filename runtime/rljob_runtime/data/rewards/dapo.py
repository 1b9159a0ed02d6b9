"""DAPO's math verifier: the answer after the last 'Answer:' near the end, Minerva-normalised, and a
reward of +1.0 when it equals the label, -1.0 otherwise (DAPO penalises wrong answers)."""

from __future__ import annotations

import re

# DAPO looks only at the tail of the response, where its prompt asks for "Answer: $Answer".
_TAIL_CHARS = 300
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
    ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation as used by DAPO (takes the right side of '=', drops units and LaTeX)."""
    s = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)
    for cmd in ("text", "textbf", "overline"):
        s = re.sub(r"(\\" + cmd + r"\{)(.*?)(\})", r"\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s)
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def dapo_extract(response: str) -> str | None:
    """The text after the last 'Answer:' in the response's tail; None when there is none."""
    found = _ANSWER.findall(response[-_TAIL_CHARS:])
    return found[-1] if found else None


def dapo_reward(response: str, label: object) -> float:
    """+1.0 if the normalised 'Answer:' equals the normalised label, else -1.0."""
    pred = dapo_extract(response)
    if pred is None or label is None:
        return -1.0
    return 1.0 if normalize_final_answer(pred) == normalize_final_answer(str(label)) else -1.0
