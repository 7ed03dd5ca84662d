"""The collector against an Agent Lightning 1.0.2 server (`agl-server`): v1.0's protocol only.

v1.0 has the terminal cursor and the full `format=triplet` read but no `/api/info` (404), so the
collector reads full triplets there. Skipped, saying why, when the reference venv is absent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from keraunos.testing.processes import Engine, unique_id
from keraunos.training.collect import CollectorConfig, RolloutCollector

pytestmark = pytest.mark.timeout(90)


def test_sync_collect_against_agent_lightning_1_0_reads_full_triplets_and_drops_a_failed_sibling(
    agl_server: Any, agents: Any
) -> None:
    cfg = CollectorConfig(
        server_url=agl_server.base_url,
        key=agl_server.key,
        run_id=unique_id("agl"),
        n=3,
        batch_size=2,
        poll_interval_s=0.05,
        retry_backoff_s=0.01,
    )
    rows = [{"question": "a"}, {"question": "b"}]

    def script(rid: str) -> Any:
        failed = rid.endswith(".i1.0")
        return agents.plan(
            turns=2, reward=1.0 if rid.endswith(".1") else 0.0, state="failed" if failed else "succeeded"
        )

    async def main() -> tuple[bool, Any]:
        async with (
            agents.run(agl_server.base_url, agl_server.key, cfg.run_id, script),
            RolloutCollector(cfg) as collector,
        ):
            return collector.uses_delta, await collector.collect(0, rows)

    uses_delta, batch = asyncio.run(main())
    assert not uses_delta
    assert [len(g.rollouts) for g in batch.groups] == [3, 2]
    assert batch.metrics["failed_rollouts"] == 1
    for rollout in batch.rollouts:
        assert len(rollout.triplets) == 2
        assert rollout.model_versions == [2, 2]
        first, second = rollout.triplets
        continued = first.prompt_ids.tolist() + first.response_ids.tolist()
        assert second.prompt_ids.tolist()[: len(continued)] == continued
        assert first.logprobs is not None and len(first.logprobs) == len(first.response_ids)
    assert [r.reward for r in batch.groups[0].rollouts] == [0.0, 1.0, 0.0]


def test_async_collect_and_pause_drain_against_agent_lightning_1_0(
    agl_server: Any, agents: Any, engine: Engine
) -> None:
    cfg = CollectorConfig(
        server_url=agl_server.base_url,
        key=agl_server.key,
        run_id=unique_id("agl"),
        n=2,
        mode="async",
        batch_size=1,
        async_batch_size=2,
        poll_interval_s=0.05,
        drain_poll_interval_s=0.02,
    )
    url = f"{agl_server.base_url}/proxy/rollout/{cfg.run_id}.s0.i0.0/attempt/0/mode/train/openai/v1/chat/completions"
    headers = {"Authorization": f"Bearer {agl_server.key}"}

    async def main() -> tuple[list[Any], Any]:
        def script(rid: str) -> Any:
            return agents.plan(turns=1)

        async with (
            agents.run(agl_server.base_url, agl_server.key, cfg.run_id, script),
            RolloutCollector(cfg) as collector,
        ):
            source = iter([{"q": i} for i in range(3)])
            batches = [await collector.collect(step, source) for step in range(2)]
        # The scripted agents are gone; a slow call of our own is the only one the pause can see.
        engine.reset()
        engine.faults(delay_ms=800, count=5)
        async with (
            httpx.AsyncClient(headers=headers, timeout=30) as client,
            RolloutCollector(cfg) as collector,
        ):
            body = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}
            call = asyncio.create_task(client.post(url, json=body))
            deadline = asyncio.get_running_loop().time() + 10
            while (await client.get(f"{agl_server.base_url}/proxy/state")).json()["inflight"] < 1:
                assert asyncio.get_running_loop().time() < deadline, "the slow call never arrived"
                await asyncio.sleep(0.02)
            report = await collector.pause_and_drain(timeout_s=10)
            await collector.resume()
            await call
        return batches, report

    batches, report = asyncio.run(main())
    assert [len(b.groups) for b in batches] == [1, 1]
    assert all(len(g.rollouts) == 2 for b in batches for g in b.groups)
    assert report.inflight_at_pause >= 1 and report.drained
