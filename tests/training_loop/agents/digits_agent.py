"""A test agent with a trivially learnable reward: the share of digits in the model's replies.

Two turns over plain HTTP (httpx only, so it starts fast): the prompt from the rollout input
(`AGENT_INPUT`), then the reply sent back with a follow-up, so every rollout makes two model calls
whose second prompt continues the first. Reward: digits / non-space characters over both replies.

Each call carries a sampling `seed` made from the rollout id and the turn, so a run samples the same
replies whatever order the warm workers' calls reach the model server in (rollout ids are the
run's `run_id` plus step, row and member: the same in every run).
"""

from __future__ import annotations

import json
import os
import time
import zlib

import httpx

from keraunos.agent import api_key, emit_reward, openai_base_url, rollout_id

MAX_TOKENS = int(os.environ.get("DIGITS_MAX_TOKENS", "6"))


def chat(client: httpx.Client, messages: list[dict[str, str]]) -> str:
    seed = zlib.crc32(f"{rollout_id()}/{len(messages)}".encode())
    body = {"model": "policy", "messages": messages, "max_tokens": MAX_TOKENS, "seed": seed}
    for _ in range(60):  # a paused gateway answers 429 with Retry-After during a weight update
        response = client.post("/chat/completions", json=body)
        if response.status_code != 429:
            response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"] or ""
        time.sleep(float(response.headers.get("retry-after", "1")))
    raise RuntimeError("the gateway stayed paused")


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def main() -> None:
    task = json.loads(os.environ["AGENT_INPUT"])
    headers = {"Authorization": f"Bearer {api_key()}"}
    with httpx.Client(base_url=openai_base_url(), headers=headers, timeout=60) as client:
        messages = [{"role": "user", "content": task["prompt"]}]
        first = chat(client, messages)
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "more"}]
        second = chat(client, messages)
    emit_reward(digit_share(first + second), reason="digit share")


if __name__ == "__main__":
    main()


class DigitsAgent:
    """The same agent as a class, for `agent_class` (and the controller's warm workers)."""

    def run(self) -> None:
        main()
