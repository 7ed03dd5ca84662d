"""The rollout collector against a real gateway and the engine stand-in (keraunos.training.collect).

Scripted agents (see conftest) play agent and controller: multi-turn calls through the proxy,
a reward event, then the final state — each rollout as its plan says.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any

import httpx
import pytest

from keraunos.testing.processes import Engine, Gateway, unique_id
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.collect import CollectedBatch, CollectorConfig, CollectorError, RolloutCollector
from keraunos.training.trajectories import TrajectoryConfig, UnresolvedSamples, build_rows

pytestmark = pytest.mark.timeout(60)

ROWS = [{"question": "2+2", "data_id": "q1"}, {"question": "3+3"}]
MODES = ["sync", "async"]


def config(gateway: Gateway, **overrides: Any) -> CollectorConfig:
    fields: dict[str, Any] = {
        "server_url": gateway.base_url,
        "key": gateway.key,
        "run_id": unique_id("run"),
        "n": 3,
        "batch_size": 2,
        "poll_interval_s": 0.05,
        "retry_backoff_s": 0.01,
    }
    return CollectorConfig(**(fields | overrides))


def collect_with(
    agents: Any, server: Any, cfg: CollectorConfig, script: Any, **kw: Any
) -> list[CollectedBatch]:
    async def main() -> list[CollectedBatch]:
        async with (
            agents.run(server.base_url, server.key, cfg.run_id, script),
            RolloutCollector(cfg) as collector,
        ):
            return [await collector.collect(0, ROWS, **kw)]

    return asyncio.run(main())


async def wait_inflight(client: httpx.AsyncClient, base_url: str, n: int, timeout_s: float = 10.0) -> None:
    """Wait until the proxy counts `n` calls in flight (they may take a while to arrive under load)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await client.get(f"{base_url}/proxy/state")).json()["inflight"] < n:
        assert asyncio.get_running_loop().time() < deadline, f"never saw {n} calls in flight"
        await asyncio.sleep(0.02)


def sibling(rollout_id: str) -> int:
    return int(rollout_id.rsplit(".", 1)[1])


def test_sync_collect_returns_complete_groups_read_exactly_from_the_compact_triplets(
    collect_gateway: Gateway, agents: Any
) -> None:
    cfg = config(collect_gateway)
    [batch] = collect_with(
        agents, collect_gateway, cfg, lambda rid: agents.plan(turns=3, reward=0.5 * sibling(rid))
    )
    assert [g.row for g in batch.groups] == ROWS
    assert [g.group_id for g in batch.groups] == [f"{cfg.run_id}.s0.i0", f"{cfg.run_id}.s0.i1"]
    for group in batch.groups:
        assert [r.rollout_id for r in group.rollouts] == [f"{group.group_id}.{k}" for k in range(3)]
        assert [r.reward for r in group.rollouts] == [0.0, 0.5, 1.0]
        for rollout in group.rollouts:
            assert len(rollout.triplets) == 3
            assert rollout.model_versions == [1, 1, 1]
            # Multi-turn calls continue each other exactly, so each rollout is one merged row.
            built = build_rows([rollout], TrajectoryConfig(max_prompt_len=64, max_response_len=128))
            assert len(built.rows) == 1 and not built.breaks
    with collect_gateway.client() as api:
        created = api.get(f"/api/rollouts/{cfg.run_id}.s0.i1.2").json()["rollout"]
        full = api.get(f"/api/rollouts/{cfg.run_id}.s0.i1.2/events", params={"format": "triplet"}).json()
    assert created["input"] == ROWS[1]  # never edited
    assert created["metadata"] == {"data_id": f"{cfg.run_id}.s0.i1", "batch_idx": 0, "sample_idx_in_batch": 1}
    last = batch.groups[1].rollouts[2]
    assert [t.prompt_ids.tolist() for t in last.triplets] == [e["data"]["prompt_token_ids"] for e in full[:3]]
    assert batch.metrics["groups"] == 2 and batch.metrics["rollouts_created"] == 6


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", ["drop", "fill"])
def test_a_failed_sibling_yields_no_rows_by_default_and_the_fill_reward_under_fill(
    collect_gateway: Gateway, agents: Any, policy: str, mode: str
) -> None:
    cfg = config(collect_gateway, failed_rollouts=policy, fill_reward=-1.0, batch_size=1, mode=mode)

    def script(rid: str) -> Any:
        return agents.plan(state="failed", reward=5.0) if sibling(rid) == 0 else agents.plan(reward=1.0)

    [batch] = collect_with(agents, collect_gateway, cfg, script)
    [group] = batch.groups
    rewards = {sibling(r.rollout_id): r.reward for r in group.rollouts}
    assert rewards == ({1: 1.0, 2: 1.0} if policy == "drop" else {0: -1.0, 1: 1.0, 2: 1.0})
    assert batch.metrics["failed_rollouts"] == 1
    assert batch.metrics.get("failed_rollouts_filled", 0) == (1 if policy == "fill" else 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_succeeded_rollout_without_reward_gets_the_fill_reward_and_is_counted(
    collect_gateway: Gateway, agents: Any, mode: str
) -> None:
    cfg = config(collect_gateway, fill_reward=0.25, batch_size=1, mode=mode)
    [batch] = collect_with(
        agents, collect_gateway, cfg, lambda rid: agents.plan(reward=None if sibling(rid) == 1 else 1.0)
    )
    assert [r.reward for r in batch.groups[0].rollouts] == [1.0, 0.25, 1.0]
    assert batch.metrics["missing_reward_rollouts"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_an_all_equal_reward_group_gets_zero_advantage_and_a_group_left_with_one_sibling_is_dropped(
    collect_gateway: Gateway, agents: Any, mode: str
) -> None:
    cfg = config(collect_gateway, n=2, mode=mode)

    def script(rid: str) -> Any:
        lonely = ".i1." in rid and sibling(rid) == 0  # row 1 loses a sibling: one left, no baseline
        return agents.plan(state="failed" if lonely else "succeeded", reward=0.7)

    [batch] = collect_with(agents, collect_gateway, cfg, script)
    assert [g.index for g in batch.groups] == [0]
    assert batch.metrics["small_groups_dropped"] == 1
    rollouts = batch.rollouts
    result = rollout_advantages(
        [r.reward for r in rollouts], [r.group_id for r in rollouts], AdvantageConfig()
    )
    assert result.advantages.tolist() == [0.0, 0.0]
    assert result.metrics["equal_reward_groups"] == 1


def test_creation_is_safe_to_retry_a_repeated_step_returns_the_same_rollouts(
    collect_gateway: Gateway, agents: Any
) -> None:
    cfg = config(collect_gateway, batch_size=1)
    [first] = collect_with(agents, collect_gateway, cfg, lambda rid: agents.plan(reward=float(sibling(rid))))
    # A new collector of the same run repeats step 0: the rollouts exist and are finished already.
    [again] = collect_with(agents, collect_gateway, cfg, lambda rid: agents.plan(reward=99.0))
    assert [r.rollout_id for r in again.rollouts] == [r.rollout_id for r in first.rollouts]
    assert [r.reward for r in again.rollouts] == [0.0, 1.0, 2.0]
    with collect_gateway.client() as api:
        mine = [
            r
            for r in api.get("/api/rollouts", params={"state_in": ["succeeded", "queuing"]}).json()
            if r["rollout_id"].startswith(cfg.run_id)
        ]
    assert len(mine) == 3


def test_a_group_that_never_finishes_completes_at_its_timeout_without_the_missing_sibling(
    collect_gateway: Gateway, agents: Any
) -> None:
    cfg = config(collect_gateway, batch_size=1, group_timeout_s=3.0)  # room for the others under load
    never = asyncio.Event()
    [batch] = collect_with(
        agents, collect_gateway, cfg, lambda rid: agents.plan(gate=never if sibling(rid) == 2 else None)
    )
    assert [sibling(r.rollout_id) for r in batch.rollouts] == [0, 1]
    assert batch.metrics["timed_out_rollouts"] == 1


def test_async_mode_carries_unfinished_groups_over_across_three_steps(
    collect_gateway: Gateway, agents: Any
) -> None:
    cfg = config(collect_gateway, mode="async", batch_size=1, async_batch_size=3, n=2)
    rows = [{"row": i} for i in range(6)]

    async def main() -> list[CollectedBatch]:
        gates: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        gates["s0.i1"].set()

        def script(rid: str) -> Any:  # gates are keyed by "s{step}.i{index}" of the group
            return agents.plan(turns=1, gate=gates[rid.split(".", 1)[1].rsplit(".", 1)[0]])

        batches = []
        async with (
            agents.run(collect_gateway.base_url, collect_gateway.key, cfg.run_id, script),
            RolloutCollector(cfg) as collector,
        ):
            source = iter(rows)
            for step, release in enumerate(("s0.i0", "s0.i2", None)):
                batches.append(await collector.collect(step, source))
                if release is not None:
                    gates[release].set()
            for gate in list(gates.values()):
                gate.set()
        return batches

    batches = asyncio.run(main())
    # Step 0 submits rows 0-2 and gets row 1; row 0 and 2 carry over while row 3 joins; and so on.
    assert [[g.row for g in b.groups] for b in batches] == [[{"row": 1}], [{"row": 0}], [{"row": 2}]]
    assert [b.groups[0].step for b in batches] == [0, 0, 0]
    assert [b.metrics["carryover_groups"] for b in batches] == [2, 2, 2]
    assert [b.metrics["carryover_age_steps_max"] for b in batches] == [0, 1, 1]
    assert [b.metrics.get("groups_submitted", 0) for b in batches] == [3, 1, 1]


@pytest.mark.parametrize("mode", MODES)
def test_groups_too_stale_in_model_versions_are_dropped_and_counted(
    collect_gateway: Gateway, agents: Any, mode: str
) -> None:
    cfg = config(collect_gateway, batch_size=1, max_staleness=1, mode=mode)
    fresh = config(collect_gateway, batch_size=1, max_staleness=1, mode=mode)
    [stale] = collect_with(agents, collect_gateway, cfg, lambda rid: agents.plan(), model_version=3)
    assert stale.groups == []
    # Sync mode gives up on its one row; async mode replaces the dropped group with the next row.
    assert stale.metrics["stale_groups_dropped"] == (1 if mode == "sync" else len(ROWS))
    [kept] = collect_with(agents, collect_gateway, fresh, lambda rid: agents.plan(), model_version=2)
    assert [g.staleness for g in kept.groups] == [1]
    assert kept.metrics["staleness_max"] == 1


def test_pause_and_drain_reports_calls_in_flight_and_what_was_left_at_the_timeout(
    collect_gateway: Gateway, engine: Engine
) -> None:
    cfg = config(collect_gateway, drain_poll_interval_s=0.02)
    rid = unique_id("drain")
    with collect_gateway.client() as api:
        api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rid}])
    url = f"{collect_gateway.proxy_base(rid)}/chat/completions"
    body = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}

    async def main() -> tuple[Any, Any, int]:
        engine.reset()
        engine.faults(delay_ms=1500, count=2)
        async with (
            httpx.AsyncClient(headers=collect_gateway.headers, timeout=30) as client,
            RolloutCollector(cfg) as collector,
        ):
            calls = [asyncio.create_task(client.post(url, json=body)) for _ in range(2)]
            await wait_inflight(client, collect_gateway.base_url, 2)
            short = await collector.pause_and_drain(timeout_s=0.1)
            full = await collector.pause_and_drain(timeout_s=10)
            refused = (await client.post(url, json=body)).status_code
            await collector.resume()
            await asyncio.gather(*calls)
            return short, full, refused

    short, full, refused = asyncio.run(main())
    assert short.inflight_at_pause >= 2 and short.inflight_at_timeout >= 2 and not short.drained
    assert full.drained and 0.3 < full.drain_seconds < 5
    assert refused == 429


def test_bad_configuration_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="async_batch_size 1 < batch_size 2"):
        CollectorConfig(server_url="http://127.0.0.1:1", batch_size=2, async_batch_size=1)


def test_collect_needs_an_open_collector(collect_gateway: Gateway) -> None:
    collector = RolloutCollector(config(collect_gateway))
    with pytest.raises(RuntimeError, match="not open"):
        asyncio.run(collector.collect(0, itertools.repeat({})))


def test_a_wrong_key_is_a_clear_error_naming_the_request(collect_gateway: Gateway) -> None:
    async def main() -> None:
        async with RolloutCollector(config(collect_gateway, key="not-the-key")):
            pass

    with pytest.raises(CollectorError, match=r"GET /api/info: HTTP 401"):
        asyncio.run(main())


# -- several samples of one prompt -----------------------------------------------------------------


def full_calls(gateway: Gateway, rollout_id: str) -> list[dict[str, Any]]:
    with gateway.client() as api:
        events = api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"}).json()
    return [e["data"] for e in events]


@pytest.mark.parametrize("rule", ["drop", "first_choice"])
def test_n_2_with_the_agent_going_on_with_choice_1_trains_choice_1_and_counts_what_is_left_out(
    collect_gateway: Gateway, agents: Any, rule: UnresolvedSamples
) -> None:
    cfg = config(collect_gateway, n=2)
    [batch] = collect_with(agents, collect_gateway, cfg, lambda rid: agents.plan(turns=2, n=2, choice=1))
    rollouts = batch.rollouts
    built = build_rows(
        rollouts, TrajectoryConfig(max_prompt_len=64, max_response_len=128, unresolved_samples=rule)
    )
    assert not built.breaks  # continuing choice 1 is no break (it was named `rewrite`)
    assert len(built.rows) == len(rollouts) == 4
    for i, rollout in enumerate(rollouts):
        first, last = (
            call["response"]["choices"] for call in full_calls(collect_gateway, rollout.rollout_id)
        )
        assert first[0]["token_ids"] != first[1]["token_ids"]  # two genuine samples
        p = built.rows.prompt_len
        n_response = int(built.rows.attention_mask[i, p:].sum())
        trained = built.rows.input_ids[i, p : p + n_response][built.rows.response_mask[i, :n_response] == 1]
        # Choice 1 of the first call trains; the last call has nothing after it: the rule decides.
        expected = first[1]["token_ids"] + (last[0]["token_ids"] if rule == "first_choice" else [])
        assert trained.tolist() == expected
    metrics = built.metrics
    assert (metrics["multi_sample_calls"], metrics["abandoned_samples"], metrics["unresolved_calls"]) == (
        8,
        4,
        4,
    )
    assert metrics["unresolved_samples_dropped"] == (8 if rule == "drop" else 4)


def test_the_same_prompt_sampled_twice_trains_the_answer_the_agent_went_on_with_not_only_the_last(
    collect_gateway: Gateway, agents: Any
) -> None:
    cfg = config(collect_gateway, n=2)
    [batch] = collect_with(
        agents, collect_gateway, cfg, lambda rid: agents.plan(turns=2, resample_first=True)
    )
    rollouts = batch.rollouts
    built = build_rows(rollouts, TrajectoryConfig(max_prompt_len=64, max_response_len=128))
    assert not built.breaks and len(built.rows) == 4
    assert (built.metrics["abandoned_samples"], built.metrics["unresolved_calls"]) == (4, 0)
    for i, rollout in enumerate(rollouts):
        calls = full_calls(collect_gateway, rollout.rollout_id)
        assert (
            len(calls) == 3
            and calls[0]["response"]["prompt_token_ids"] == calls[1]["response"]["prompt_token_ids"]
        )
        answered, resampled = (c["response"]["choices"][0]["token_ids"] for c in calls[:2])
        assert answered != resampled
        p = built.rows.prompt_len
        assert built.rows.input_ids[i, p : p + len(answered)].tolist() == answered  # the earlier answer
        with collect_gateway.client() as api:
            triplets = api.get(
                f"/api/rollouts/{rollout.rollout_id}/events", params={"format": "triplet"}
            ).json()
        # v1.0's fields keep the last call; the earlier one rides along instead of vanishing.
        assert [e["data"]["response_token_ids"] for e in triplets[:2]] == [
            resampled,
            calls[2]["response"]["choices"][0]["token_ids"],
        ]
        assert [r["response_token_ids"] for r in triplets[0]["data"]["replaced_calls"]] == [answered]
