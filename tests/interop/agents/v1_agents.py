"""Agents written for Agent Lightning v1.0, run by its own controller (`agl-controller`).

They use only what v1.0 agents use: the environment contract and plain HTTP (httpx is installed
with agentlightning). Nothing here imports keraunos.
"""

from __future__ import annotations

import os

import httpx


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['AGL_KEY']}"}


class AnsweringAgent:
    """Two chat turns through the proxy, then a reward of 1.0 (sync `run`)."""

    def run(self) -> None:
        base = os.environ["AGL_OPENAI_BASE_URL"]
        messages = [{"role": "user", "content": f"question {os.environ.get('QUESTION', '?')}"}]
        with httpx.Client(headers=_headers(), timeout=30) as client:
            for _ in range(2):
                response = client.post(
                    f"{base}/chat/completions",
                    json={"model": "anything", "messages": messages, "max_tokens": 8},
                )
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                messages += [message, {"role": "user", "content": "and then?"}]
            reward = {"event_type": "reward", "data": {"value": 1.0}}
            client.post(os.environ["AGL_EVENT_URL"], json=reward).raise_for_status()


class AsyncAnsweringAgent:
    """One completion through the proxy, then a reward of 0.5 (async `run`)."""

    async def run(self) -> None:
        base = os.environ["AGL_OPENAI_BASE_URL"]
        async with httpx.AsyncClient(headers=_headers(), timeout=30) as client:
            response = await client.post(
                f"{base}/completions", json={"model": "anything", "prompt": "2 + 2 =", "max_tokens": 4}
            )
            response.raise_for_status()
            reward = {"event_type": "reward", "data": {"value": 0.5}}
            (await client.post(os.environ["AGL_EVENT_URL"], json=reward)).raise_for_status()


class FailingAgent:
    """Raises: v1.0's worker exits 1 and its controller marks the rollout failed."""

    def run(self) -> None:
        raise RuntimeError("this agent always fails")
