"""Seeded arithmetic questions for the calc agent, as JSONL rows `{"id", "question", "answer"}`.

    python -m keraunos.examples.calc.dataset --rows 200 --seed 0 --out calc.jsonl

Each question combines 2 to `max_operands` integers in [0, `max_value`] with + - * and exact
division (a divisor is only used when it divides evenly), so every answer is an integer. The
answer is computed with the agent's own calculator. Same arguments, same rows.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator

from keraunos.examples.calc.protocol import evaluate


def make_question(rng: random.Random, *, max_operands: int = 2, max_value: int = 99) -> tuple[str, int]:
    """One expression and its integer value; the expression reads left to right with usual precedence."""
    count = rng.randint(2, max(2, max_operands))
    values = [rng.randint(0, max_value)]
    ops: list[str] = []
    for _ in range(count - 1):
        op = rng.choice("+-*/" if not ops or ops[-1] != "/" else "+-*")
        if op == "/":
            # An exact division: the number before it becomes a multiple of the divisor.
            divisor = rng.randint(1, 12)
            values[-1] = divisor * rng.randint(0, max(1, max_value // divisor))
            values.append(divisor)
        else:
            values.append(rng.randint(0, max_value))
        ops.append(op)
    terms = [str(values[0])] + [f"{op} {value}" for op, value in zip(ops, values[1:], strict=True)]
    expression = " ".join(terms)
    value = evaluate(expression)
    if value.denominator != 1:  # e.g. a / b * c after an earlier division: draw again
        return make_question(rng, max_operands=max_operands, max_value=max_value)
    return expression, int(value)


def generate(rows: int, *, seed: int = 0, max_operands: int = 2, max_value: int = 99) -> Iterator[dict]:
    """`rows` dataset rows `{"id": "calc-SEED-I", "question": "What is ...?", "answer": int}`."""
    rng = random.Random(seed)
    for i in range(rows):
        expression, answer = make_question(rng, max_operands=max_operands, max_value=max_value)
        yield {"id": f"calc-{seed}-{i}", "question": f"What is {expression}?", "answer": answer}


def main(argv: list[str] | None = None) -> int:
    """Write the rows to `--out` (default: standard output)."""
    parser = argparse.ArgumentParser(
        prog="python -m keraunos.examples.calc.dataset",
        description="Write seeded arithmetic questions as JSONL.",
    )
    parser.add_argument("--rows", type=int, default=200, help="number of questions (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--max-operands", type=int, default=2, help="integers per question, at most (default 2)"
    )
    parser.add_argument("--max-value", type=int, default=99, help="largest integer drawn (default 99)")
    parser.add_argument("--out", default="-", help="output file (default: standard output)")
    args = parser.parse_args(argv)
    if args.rows < 0 or args.max_value < 1 or args.max_operands < 2:
        parser.error("need --rows >= 0, --max-value >= 1 and --max-operands >= 2")
    lines = (
        json.dumps(row)
        for row in generate(
            args.rows, seed=args.seed, max_operands=args.max_operands, max_value=args.max_value
        )
    )
    text = "".join(line + "\n" for line in lines)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
