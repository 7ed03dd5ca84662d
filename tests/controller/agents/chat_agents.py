"""Agents that talk to the model with the official `openai` client, imported at the top as agents do.

A warm worker imports this module (and `openai`, about a second of CPU) once, then forks a run.
"""

from __future__ import annotations

import asyncio
import os

from controller_agents import reward
from openai import AsyncOpenAI, OpenAI


class ChatAgent:
    """One chat call with the official `openai` client, a line on stdout, then a reward of 1.0."""

    def run(self) -> None:
        client = OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0
        )
        question = os.environ.get("QUESTION", "?")
        reply = client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": f"question {question}"}], max_tokens=4
        )
        print(f"agent saw {len(reply.choices)} choice(s) for question {question}", flush=True)
        reward(1.0)


class AsyncChatAgent:
    """ChatAgent with an async `run()` and the async client."""

    async def run(self) -> None:
        client = AsyncOpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0
        )
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "async question"}], max_tokens=4
        )
        await asyncio.to_thread(reward, 0.5)
