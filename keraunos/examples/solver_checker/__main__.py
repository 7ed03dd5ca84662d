"""Run the solver-checker dialogue against OpenAI-compatible servers, outside keraunos.

    python -m keraunos.examples.solver_checker --base-url http://127.0.0.1:8000/v1 --model NAME --question "What is 12*7?" --answer 84
    python -m keraunos.examples.solver_checker --base-url URL --checker-base-url URL2 --dataset calc.jsonl --limit 20

Prints each dialogue (with --verbose) and the solver's accuracy and the checker's agreement with
the truth. No reward is posted: that happens only inside a rollout (`SolverCheckerAgent`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from keraunos.examples.calc.agent import openai_chat
from keraunos.examples.solver_checker.dialogue import converse, solver_reward


def main(argv: list[str] | None = None) -> int:
    """Run one question or the first rows of a JSONL dataset; exit status 0."""
    parser = argparse.ArgumentParser(
        prog="python -m keraunos.examples.solver_checker", description="Run the solver-checker dialogue."
    )
    parser.add_argument("--base-url", required=True, help="the solver's OpenAI base URL, with /v1")
    parser.add_argument("--checker-base-url", help="the checker's (default: --base-url)")
    parser.add_argument("--model", default="policy", help="model name the servers know")
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"), help="default: $OPENAI_API_KEY"
    )
    parser.add_argument("--question", help="one question (with --answer)")
    parser.add_argument("--answer", help="its expected answer")
    parser.add_argument("--dataset", help="JSONL rows with question and answer (the calc dataset's)")
    parser.add_argument("--limit", type=int, default=20, help="rows of --dataset to run (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="solver-checker rounds (default 2)")
    parser.add_argument("--solver-turns", type=int, default=2, help="solver replies per round (default 2)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per reply (default 128)")
    parser.add_argument("--verbose", action="store_true", help="print every dialogue")
    args = parser.parse_args(argv)
    if args.dataset:
        with open(args.dataset, encoding="utf-8") as lines:
            tasks = [json.loads(line) for line in lines if line.strip()][: args.limit]
    elif args.question is not None and args.answer is not None:
        tasks = [{"question": args.question, "answer": args.answer}]
    else:
        parser.error("give --dataset, or --question with --answer")

    from openai import OpenAI

    solver = openai_chat(OpenAI(base_url=args.base_url, api_key=args.api_key), args.model, args.max_tokens)
    checker_url = args.checker_base_url or args.base_url
    checker = openai_chat(OpenAI(base_url=checker_url, api_key=args.api_key), args.model, args.max_tokens)
    solved = agreed = reviews = 0.0
    for task in tasks:
        dialogue = converse(
            task["question"],
            task["answer"],
            solver,
            checker,
            rounds=args.rounds,
            solver_turns=args.solver_turns,
        )
        solved += solver_reward(dialogue, task["answer"])
        agreed += sum(review.reward for review in dialogue.reviews)
        reviews += len(dialogue.reviews)
        if args.verbose:
            for message in dialogue.solver_messages[1:]:
                print(f"{message['role']:>9}: {message['content']}")
            print(f"   solver reward {solver_reward(dialogue, task['answer'])} (expected {task['answer']})\n")
    print(
        f"solver accuracy {solved / len(tasks):.3f} over {len(tasks)} questions; "
        f"checker right in {agreed / max(reviews, 1):.3f} of {int(reviews)} reviews"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
