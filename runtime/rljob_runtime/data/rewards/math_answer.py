"""Final-answer extraction and normalisation for math rewards (pure string logic, no sympy).

Equivalence: two answers are equal when their normalised strings match or both evaluate (with a
tiny arithmetic evaluator: + - * / ^, parentheses, sqrt) to numbers within 1e-6 relative tolerance.
"""

from __future__ import annotations

import ast
import math
import operator
import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
# A number not glued to a preceding word (so "x-5" and "3-5" do not yield "-5"), with thousands
# commas, decimals and an optional "/denominator".
_NUMBER = re.compile(
    r"(?<![\w)\]}.])(?<!\d,)(?:-\s?)?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:\s?/\s?\d+(?:\.\d+)?)?"
)
_UNIT_WORDS = (
    "dollars|dollar|cents|cent|degrees|degree|units|unit|percent|inches|inch|feet|foot|meters|metres|"
    "hours|hour|minutes|minute|seconds|second|mph|km|cm|kg|miles|mile|pounds|days|day|years|year"
)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (balanced nested braces) or \\boxed x; None if absent/unclosed."""
    matches = list(_BOXED.finditer(text))
    for m in reversed(matches):
        start = m.end()
        if start < len(text) and text[start] != "{":
            word = re.match(r"[^\s$]+", text[start:])  # "\boxed 5" form
            return word.group(0) if word else None
        depth = 0
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + 1 : i]
    return None


def last_number(text: str) -> str | None:
    """The last number in the text (keeps its sign, thousands commas and a fraction bar)."""
    found = _NUMBER.findall(text)
    return found[-1].replace(" ", "") if found else None


def extract_answer(text: str) -> str | None:
    """The final answer: the last \\boxed{} content, else the last number."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else last_number(text)


def _unwrap(cmd: str, s: str) -> str:
    """Replace \\cmd{X} by X for non-nested X, repeatedly."""
    pattern = re.compile(r"\\" + cmd + r"\s*\{([^{}]*)\}")
    while True:
        new = pattern.sub(r"\1", s)
        if new == s:
            return s
        s = new


def _frac(m: re.Match[str]) -> str:
    num, den = m.group(1), m.group(2)
    wrap = (lambda x: x) if all(re.fullmatch(r"-?[\w.]+", x) for x in (num, den)) else (lambda x: f"({x})")
    return f"{wrap(num)}/{wrap(den)}"


def normalize(answer: str) -> str:
    """A canonical string for an answer: LaTeX wrappers, units, currency, commas and spaces removed."""
    s = str(answer).strip()
    boxed = last_boxed(s)
    if boxed is not None:
        s = boxed
    for cmd in ("text", "textbf", "mathrm", "mathbf", "mbox", "operatorname"):
        s = _unwrap(cmd, s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    while True:  # innermost fractions first so nested ones become parenthesised divisions
        new = re.sub(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", _frac, s)
        if new == s:
            break
        s = new
    s = re.sub(r"\\sqrt\s*(\d|\w)(?![\w{])", r"\\sqrt{\1}", s)
    for token in (r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\ ", r"\displaystyle"):
        s = s.replace(token, "")
    s = re.sub(r"\^\s*\{?\\circ\}?|°", "", s)
    s = s.replace(r"\%", "").replace("%", "").replace(r"\$", "").replace("$", "")
    s = s.replace(r"\cdot", "*").replace(r"\times", "*")
    s = re.sub(rf"\b(?:{_UNIT_WORDS})\b\.?", "", s, flags=re.IGNORECASE)
    if s.count("=") == 1 and re.match(r"^\s*[A-Za-z]\w*\s*=", s):
        s = s.split("=", 1)[1]  # "x = 4" -> "4"
    s = re.sub(r"\s+", "", s)
    while re.search(r"\d,\d{3}(?!\d)", s):
        s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s)
    s = s.rstrip(".").lstrip("+")
    if s.startswith("{") and s.endswith("}") and s.count("{") == 1:
        s = s[1:-1]
    return s


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def _eval(node: ast.AST) -> float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "sqrt"
        and len(node.args) == 1
    ):
        return math.sqrt(_eval(node.args[0]))
    raise ValueError("not arithmetic")


def to_number(normalized: str) -> float | None:
    """The value of a normalised answer made only of numbers and arithmetic; None otherwise."""
    expr = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", normalized).replace("^", "**").replace("{", "(")
    expr = expr.replace("}", ")")
    if not expr or len(expr) > 100 or not re.fullmatch(r"[\d.+\-*/() sqrt]+", expr):
        return None
    try:
        value = _eval(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def answers_equal(pred: str | None, label: object) -> bool:
    """Whether a predicted answer equals the label after normalisation (numerically when both are numbers)."""
    if pred is None or label is None:
        return False
    a, b = normalize(pred), normalize(str(label))
    if not a or not b:
        return False
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def math_reward(response: str, label: object) -> float:
    """1.0 when the response's final answer (last \\boxed{} or last number) equals the label, else 0.0."""
    return 1.0 if answers_equal(extract_answer(response), label) else 0.0
