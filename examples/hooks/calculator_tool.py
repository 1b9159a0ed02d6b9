"""A multi-turn tool hook for rollout.customGenerate: a calculator the model calls inline.

The model may write ``<calc>12*7</calc>``; generation stops there (a stop string), the hook evaluates
the expression with a tiny arithmetic parser (never ``eval``), appends ``<result>84</result>`` as a
tool turn (loss mask 0: the model is not trained to predict tool output) and lets the model go on,
for at most ``MAX_TURNS`` model turns. Used by examples/manifests/grpo-multiturn-tools.yaml; the
runtime imports it as ``calculator_tool:generate`` with ``examples/hooks`` on PYTHONPATH.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rljob_runtime.data.sample import Sample, Status
from rljob_runtime.rollout.custom_generate import GenerateContext, append_model_turn, append_tool_turn

MAX_TURNS = 4  # model turns per sample; a tool call on the last one ends the sample truncated
CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
MAX_EXPRESSION_CHARS = 100
MAX_DIGITS = 30  # refuse results (and operands) beyond this: no huge numbers from a sampled expression


class CalcError(ValueError):
    """The expression is not plain arithmetic, or cannot be evaluated."""


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|(.))")


def _tokens(text: str) -> list[str]:
    tokens = []
    for number, other in _TOKEN.findall(text):
        if number:
            tokens.append(number)
        elif other in "+-*/()":
            tokens.append(other)
        elif not other.isspace():
            raise CalcError(f"unexpected character {other!r}")
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)*;  term := unary (('*'|'/') unary)*;
    unary := '-' unary | '+' unary | atom;  atom := number | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise CalcError("unexpected end of expression")
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
            _check_size(value)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.unary()
            else:
                divisor = self.unary()
                if divisor == 0:
                    raise CalcError("division by zero")
                value /= divisor
            _check_size(value)
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("-", "+"):
            sign = self.take()
            self.depth += 1
            if self.depth > 50:
                raise CalcError("too deeply nested")
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.atom()

    def atom(self) -> Fraction:
        token = self.take()
        if token == "(":
            self.depth += 1
            if self.depth > 50:
                raise CalcError("too deeply nested")
            value = self.expr()
            if self.take() != ")":
                raise CalcError("expected ')'")
            self.depth -= 1
            return value
        if token in "+-*/)":
            raise CalcError(f"unexpected {token!r}")
        value = Fraction(token)
        _check_size(value)
        return value


def _check_size(value: Fraction) -> None:
    if len(str(abs(value.numerator))) > MAX_DIGITS or len(str(value.denominator)) > MAX_DIGITS:
        raise CalcError("number too large")


def calculate(expression: str) -> str:
    """Evaluate + - * / and parentheses on decimal numbers exactly; the result as text.

    Integers print as integers, other results rounded to 6 decimals. Anything else (names,
    attribute access, ``**``, calls) raises ``CalcError``.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    parser = _Parser(_tokens(expression))
    if not parser.tokens:
        raise CalcError("empty expression")
    value = parser.expr()
    if parser.peek() is not None:
        raise CalcError(f"unexpected {parser.peek()!r}")
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def tool_output(expression: str) -> str:
    """The observation the model sees after ``<calc>expression</calc>``."""
    try:
        return f"<result>{calculate(expression)}</result>"
    except CalcError as exc:
        return f"<result>error: {exc}</result>"


def last_call(text: str) -> str | None:
    """The expression of the last complete ``<calc>...</calc>`` in ``text``, if any."""
    calls = CALL.findall(text)
    return calls[-1] if calls else None


async def generate(ctx: GenerateContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Model turn, tool turn, model turn, ... until an answer without a call, the budget or MAX_TURNS."""
    params = dict(sampling_params)
    params["stop"] = [*(params.get("stop") or []), CALL_CLOSE]
    params["no_stop_trim"] = True  # keep '</calc>' in the turn's text, as it is in the turn's tokens
    for turn in range(MAX_TURNS):
        left = ctx.budget_left(sample)
        if left <= 0:
            sample.status = Status.TRUNCATED
            break
        answer = await ctx.generate(sample.tokens, {**params, "max_new_tokens": left})
        model_turn = append_model_turn(sample, answer)  # mask 1, status from the finish reason
        expression = last_call(model_turn.text) if model_turn.finish_reason == "stop" else None
        if expression is None:
            break  # an answer (stop) or out of tokens (truncated): the status is already right
        if turn == MAX_TURNS - 1:
            sample.status = Status.TRUNCATED  # it still wanted the tool: not a finished answer
            break
        text = tool_output(expression)
        # The token that completed '</calc>' may carry more text (SmolLM2 has a '><' token, so the
        # turn can end in '</calc><'): do not repeat what the model already wrote of the result.
        written = model_turn.text[model_turn.text.rindex(CALL_CLOSE) + len(CALL_CLOSE) :]
        if written and text.startswith(written):
            text = text[len(written) :]
        ids = ctx.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= ctx.budget_left(sample):
            sample.status = Status.TRUNCATED  # no room for the result and an answer after it
            break
        append_tool_turn(sample, ids, text)  # mask 0, logprob 0.0
        sample.metadata["tool_calls"] = sample.metadata.get("tool_calls", 0) + 1
    return sample
