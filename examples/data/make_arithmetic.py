"""Write the arithmetic prompt sets used by the CPU demo and the learning tests (deterministic).

python examples/data/make_arithmetic.py     # rewrites examples/data/*.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
PROMPT = "What is {a} {op} {b}? Answer with just the number."
OPS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}


def rows(op: str, digits: int, n: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    out = []
    for i in range(n):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        out.append(
            {
                "prompt": PROMPT.format(a=a, op=op, b=b),
                "label": str(OPS[op](a, b)),
                "metadata": {"id": i, "a": a, "b": b, "op": op},
            }
        )
    return out


# The calculator-tool example (examples/hooks/calculator_tool.py): chat prompts with one worked
# example, so that even SmolLM2-135M writes <calc>...</calc> and copies the <result> into its answer.
CALC_SYSTEM = (
    "You can use a calculator: write <calc>expression</calc> and the result comes back as "
    "<result>value</result>. Then answer with the number."
)
CALC_SHOT = [
    {"role": "user", "content": "What is 12 * 7?"},
    {"role": "assistant", "content": "<calc>12*7</calc><result>84</result> The answer is 84."},
]


def calc_rows(n: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        op = rng.choice("+*")
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        question = f"What is {a} {op} {b}?"
        out.append(
            {
                "prompt": [
                    {"role": "system", "content": CALC_SYSTEM},
                    *CALC_SHOT,
                    {"role": "user", "content": question},
                ],
                "label": str(OPS[op](a, b)),
                "metadata": {"id": i, "a": a, "b": b, "op": op},
            }
        )
    return out


def write(name: str, data: list[dict[str, object]]) -> None:
    with open(HERE / name, "w") as f:
        for row in data:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    write("add-1digit.jsonl", rows("+", 1, 512, seed=1))
    write("add-1digit-eval.jsonl", rows("+", 1, 64, seed=2))
    write("mul-1digit.jsonl", rows("*", 1, 512, seed=3))
    write("calc-2digit.jsonl", calc_rows(64, seed=4))
