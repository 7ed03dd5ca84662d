"""Stored rollouts for the re-reward tests, made through a real gateway's proxy.

`fill` plays agent and controller for one rollout: running, two chat turns through the proxy (the
engine stand-in answers), a `reward` event, succeeded. `store_groups` creates and fills groups of
them; `agents` fills every queuing rollout of a run in the background, for the collector's tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from keraunos.testing.processes import Gateway

HERE = Path(__file__).resolve().parent


async def fill(api: httpx.AsyncClient, rollout_id: str, reward: float | None, turns: int = 2) -> None:
    """Run one created rollout as an agent would: calls through the proxy, its reward, succeeded."""
    await api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "running"}})
    url = f"/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rollout_id}"}]
    for turn in range(turns):
        answer = (await api.post(url, json={"messages": messages, "max_tokens": 6})).json()
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        messages.append({"role": "tool", "content": f"result {turn}"})
    if reward is not None:
        event = {"event_type": "reward", "data": {"value": reward}}
        (await api.post(f"/api/rollouts/{rollout_id}/attempt/0/events", json=event)).raise_for_status()
    (
        await api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "succeeded"}})
    ).raise_for_status()


def store_groups(gateway: Gateway, groups: dict[str, list[float]], *, prefix: str) -> list[str]:
    """Create and finish one rollout per reward, grouped by `metadata.data_id`; their ids in order."""

    async def main() -> list[str]:
        ids = []
        async with httpx.AsyncClient(base_url=gateway.base_url, headers=gateway.headers, timeout=30) as api:
            for data_id, rewards in groups.items():
                items = [
                    {
                        "rollout_id": f"{prefix}.{data_id}.{k}",
                        "input": {"question": f"what is {data_id}?"},
                        "metadata": {"data_id": data_id},
                    }
                    for k in range(len(rewards))
                ]
                (await api.post("/api/rollouts", json=items)).raise_for_status()
                for item, reward in zip(items, rewards, strict=True):
                    await fill(api, item["rollout_id"], reward)  # in order: the terminal cursor's order
                    ids.append(item["rollout_id"])
        return ids

    return asyncio.run(main())


@contextlib.asynccontextmanager
async def agents(gateway: Gateway, prefix: str, reward: Callable[[str], float]) -> AsyncIterator[None]:
    """Fill every queuing rollout whose id starts with `prefix`, in the background, for the block."""
    started: set[str] = set()
    tasks: list[asyncio.Task[None]] = []

    async def loop(api: httpx.AsyncClient) -> None:
        while True:
            queuing = (await api.get("/api/rollouts", params={"state_in": "queuing", "limit": 10_000})).json()
            for rollout in queuing:
                rid = rollout["rollout_id"]
                if rid.startswith(prefix) and rid not in started:
                    started.add(rid)
                    tasks.append(asyncio.create_task(fill(api, rid, reward(rid))))
            await asyncio.sleep(0.02)

    async with httpx.AsyncClient(base_url=gateway.base_url, headers=gateway.headers, timeout=30) as api:
        runner = asyncio.create_task(loop(api))
        try:
            yield
        finally:
            for task in [runner, *tasks]:
                task.cancel()
            await asyncio.gather(runner, *tasks, return_exceptions=True)
