"""Run the calc agent against any OpenAI-compatible server, outside keraunos.

    python -m keraunos.examples.calc --base-url http://127.0.0.1:8000/v1 --model NAME --question "What is 12*7?" --answer 84
    python -m keraunos.examples.calc --base-url http://127.0.0.1:8000/v1 --model NAME --dataset calc.jsonl --limit 20

Prints each conversation (with --verbose) and the accuracy. No reward is posted: that happens only
inside a rollout (`CalcAgent`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from keraunos.examples.calc.agent import openai_chat
from keraunos.examples.calc.conversation import reward_of, solve


def main(argv: list[str] | None = None) -> int:
    """Solve one question or the first rows of a JSONL dataset; exit status 0."""
    parser = argparse.ArgumentParser(
        prog="python -m keraunos.examples.calc", description="Run the calc agent."
    )
    parser.add_argument("--base-url", required=True, help="OpenAI base URL, with /v1")
    parser.add_argument("--model", required=True, help="model name the server knows")
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"), help="default: $OPENAI_API_KEY"
    )
    parser.add_argument("--question", help="one question (with --answer)")
    parser.add_argument("--answer", help="its expected answer")
    parser.add_argument("--dataset", help="JSONL rows with question and answer")
    parser.add_argument("--limit", type=int, default=20, help="rows of --dataset to run (default 20)")
    parser.add_argument("--max-turns", type=int, default=4, help="model calls per question (default 4)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per reply (default 128)")
    parser.add_argument("--verbose", action="store_true", help="print every conversation")
    args = parser.parse_args(argv)
    if args.dataset:
        with open(args.dataset, encoding="utf-8") as lines:
            tasks = [json.loads(line) for line in lines if line.strip()][: args.limit]
    elif args.question is not None and args.answer is not None:
        tasks = [{"question": args.question, "answer": args.answer}]
    else:
        parser.error("give --dataset, or --question with --answer")

    from openai import OpenAI

    chat = openai_chat(OpenAI(base_url=args.base_url, api_key=args.api_key), args.model, args.max_tokens)
    correct = 0.0
    for task in tasks:
        episode = solve(task["question"], chat, max_turns=args.max_turns)
        reward = reward_of(episode, task["answer"])
        correct += reward
        if args.verbose:
            for message in episode.messages[1:]:
                print(f"{message['role']:>9}: {message['content']}")
            print(f"   reward: {reward}  (expected {task['answer']}, {episode.model_calls} model calls)\n")
    print(f"accuracy {correct / len(tasks):.3f} over {len(tasks)} questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
