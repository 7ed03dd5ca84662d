"""Training picks the reward version: the collector (keraunos.training.collect) against a real
gateway, its rollouts re-rewarded in between (keraunos.rereward.run, a callable as the scorer)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rereward_support import agents

from keraunos.rereward.config import RerewardConfig
from keraunos.rereward.run import rereward
from keraunos.rereward.scorers import CallableScorer
from keraunos.testing.processes import Gateway, unique_id
from keraunos.training.collect import CollectedBatch, CollectorConfig, RolloutCollector

pytestmark = pytest.mark.timeout(120)

ROWS = [{"question": "a"}, {"question": "b"}]


def collect(gateway: Gateway, run_id: str, **fields: Any) -> CollectedBatch:
    """One sync batch of the ROWS (3 rollouts each) under `run_id`; agents reward sibling 0 only."""
    config = CollectorConfig(
        server_url=gateway.base_url,
        key=gateway.key,
        run_id=run_id,
        n=3,
        batch_size=2,
        poll_interval_s=0.05,
        retry_backoff_s=0.01,
        **fields,
    )

    async def main() -> CollectedBatch:
        async with (
            agents(gateway, run_id, lambda rid: 1.0 if rid.endswith(".0") else 0.0),
            RolloutCollector(config) as collector,
        ):
            return await collector.collect(0, ROWS)

    return asyncio.run(main())


def rewards(batch: CollectedBatch) -> dict[str, float]:
    return {rollout.rollout_id: rollout.reward for rollout in batch.rollouts}


def test_a_collected_batch_trains_on_the_chosen_version_and_a_rollout_without_it_gets_fill_reward(
    stack: Gateway,
) -> None:
    run_id = unique_id("rrc")
    agent = rewards(collect(stack, run_id))
    assert sorted(agent.values()) == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]

    # A new reward for every rollout but one, by sibling index (the agents' first message names the id).
    chosen = {rid: 0.1 * (1 + int(rid.rsplit(".", 1)[1])) for rid in agent if rid != f"{run_id}.s0.i1.2"}
    scorer = CallableScorer(lambda input, messages, old: chosen[messages[0]["content"].removeprefix("task ")])
    config = RerewardConfig(
        # The scorer is passed in: the config's callable only names it (its check wants one scorer).
        gateway=stack.base_url,
        key=stack.key,
        version="v2",
        callable="x:y",
        rollout_ids=",".join(chosen),
    )
    summary = asyncio.run(rereward(config, scorer))
    assert (summary.scored, summary.failed) == (5, 0)

    # A resumed run's collector (the same ids) reads the same finished rollouts again.
    again = collect(stack, run_id, reward_version="v2", fill_reward=-1.0)
    assert rewards(again) == {rid: chosen.get(rid, -1.0) for rid in agent}
    assert again.metrics["missing_reward_rollouts"] == 1
    assert rewards(collect(stack, run_id)) == agent  # without a version: the agent's reward, untouched
