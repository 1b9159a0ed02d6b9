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


def write(name: str, data: list[dict[str, object]]) -> None:
    with open(HERE / name, "w") as f:
        for row in data:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    write("add-1digit.jsonl", rows("+", 1, 512, seed=1))
    write("add-1digit-eval.jsonl", rows("+", 1, 64, seed=2))
    write("mul-1digit.jsonl", rows("*", 1, 512, seed=3))
