"""A test agent whose only signal is in its intermediate rewards: one reward per turn, an empty outcome.

`TURNS` turns over plain HTTP, each turn's prompt continuing the conversation so far; right after
each call the agent posts that turn's reward with the SDK (`emit_reward(..., turn=k)`: its position
is the call it follows), the share of digits in that turn's reply. At the end it posts the outcome,
1.0 whatever happened (the task always "completes"), so the final reward, the rollout's last one,
tells nothing: under `credit: final` every group's rewards are equal and every advantage is 0.

Sampling seeds come from the rollout id and the turn (`digits_agent.chat`), so two runs with the
same `run_id` sample the same replies at their first step.
"""

from __future__ import annotations

import json
import os

import httpx
from digits_agent import chat, digit_share

from keraunos.agent import api_key, emit_reward, openai_base_url

TURNS = int(os.environ.get("TURNS_AGENT_TURNS", "3"))
FOLLOW_UPS = ("go on", "and then", "once more", "again")


def main() -> None:
    task = json.loads(os.environ["AGENT_INPUT"])
    headers = {"Authorization": f"Bearer {api_key()}"}
    with httpx.Client(base_url=openai_base_url(), headers=headers, timeout=60) as client:
        messages = [{"role": "user", "content": task["prompt"]}]
        for turn in range(TURNS):
            reply = chat(client, messages)
            emit_reward(digit_share(reply), turn=turn, reason="digit share of this turn's reply")
            follow_up = FOLLOW_UPS[turn % len(FOLLOW_UPS)]
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
    emit_reward(1.0, reason="the outcome: the task completed, whatever the replies were")


if __name__ == "__main__":
    main()


class TurnsAgent:
    """The same agent as a class, for `agent_class` (and the controller's warm workers)."""

    def run(self) -> None:
        main()
