"""A modified calc agent for the replay tests: the calc agent's loop and reward with another system
prompt, so its first model call differs from a record of the calc agent at `messages[0].content`."""

from __future__ import annotations

import os

from openai import OpenAI

from keraunos.agent import api_key, emit_reward, openai_base_url
from keraunos.examples.calc.agent import openai_chat, read_task
from keraunos.examples.calc.conversation import reward_of, solve

OTHER_PROMPT = "Answer with <answer>NUMBER</answer> only."


class OtherPromptCalcAgent:
    """`CalcAgent` (same turns, tokens and model name) but for the system prompt."""

    def run(self) -> None:
        question, expected = read_task(os.environ)
        client = OpenAI(base_url=openai_base_url(), api_key=api_key(), max_retries=8)
        chat = openai_chat(
            client, os.environ.get("CALC_MODEL", "policy"), int(os.environ.get("CALC_MAX_TOKENS", "48"))
        )
        episode = solve(
            question, chat, max_turns=int(os.environ.get("CALC_MAX_TURNS", "4")), system_prompt=OTHER_PROMPT
        )
        emit_reward(reward_of(episode, expected))
