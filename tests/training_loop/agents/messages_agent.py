"""The digits agent of digits_agent.py speaking the Anthropic Messages API with the official SDK.

Two turns through the gateway's `.../anthropic/v1/messages` (docs/harnesses.md), the second
continuing the first; reward: the digit share of both replies. The gateway converts each call to
the chat call a chat agent would make, so the trainer builds its rows from them unchanged.
"""

from __future__ import annotations

import json
import os

import anthropic
from digits_agent import MAX_TOKENS, digit_share

from keraunos.agent import anthropic_base_url, api_key, emit_reward


def reply(client: anthropic.Anthropic, messages: list[dict[str, str]]) -> str:
    message = client.messages.create(model="policy", max_tokens=MAX_TOKENS, messages=messages)  # type: ignore[arg-type]
    return "".join(block.text for block in message.content if block.type == "text")


class MessagesAgent:
    """For `agent_class` (the controller's warm workers)."""

    def run(self) -> None:
        task = json.loads(os.environ["AGENT_INPUT"])
        # A paused gateway answers 429 with Retry-After during a weight update: the SDK waits and retries.
        client = anthropic.Anthropic(
            base_url=anthropic_base_url(), api_key=api_key(), max_retries=60, timeout=60
        )
        messages = [{"role": "user", "content": task["prompt"]}]
        first = reply(client, messages)
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "more"}]
        second = reply(client, messages)
        emit_reward(digit_share(first + second), reason="digit share")
