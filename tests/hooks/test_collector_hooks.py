"""The trainer's lifecycle hooks, end to end: `RolloutCollector` creating rollouts on a real
gateway, a real `keraunos controller` running `hooks_agents:RewardAgent` on them, and the hooks
(in the test's process, where the collector runs) noting each call."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from hooks_support import AGENT, Notes

from keraunos._settings import ConfigError
from keraunos.protocol import RolloutConfig
from keraunos.testing.processes import Gateway, RunningProcess, unique_id
from keraunos.training.collect import CollectedBatch, CollectorConfig, RolloutCollector
from keraunos.training.train_config import TrainConfig

pytestmark = pytest.mark.timeout(120)

StartController = Callable[..., RunningProcess]

#: How long `hooks_record.hang` sleeps.
HANG_S = 30.0


def collector_config(gateway: Gateway, **overrides: Any) -> CollectorConfig:
    fields: dict[str, Any] = {
        "server_url": gateway.base_url,
        "key": gateway.key,
        "run_id": unique_id("hooks"),
        "n": 2,
        "batch_size": 2,
        "min_group_size": 1,
        "poll_interval_s": 0.1,
        "rollout_config": RolloutConfig.model_validate(
            {"local": {"agent_class": AGENT, "env_map": {"AGENT_INPUT": "input"}}}
        ),
    }
    return CollectorConfig(**(fields | overrides))


def collect(cfg: CollectorConfig, rows: list[Any]) -> CollectedBatch:
    async def main() -> CollectedBatch:
        async with RolloutCollector(cfg) as collector:
            return await collector.collect(0, rows)

    return asyncio.run(main())


def test_the_collector_fires_on_enqueue_per_rollout_created_and_the_end_hooks_with_the_reward_read(
    gateway: Gateway, start_controller: StartController, notes: Notes
) -> None:
    start_controller(gateway)
    cfg = collector_config(
        gateway,
        hook_on_enqueue="hooks_record:record",
        hook_on_success="hooks_record:record_async",
        hook_on_failure="hooks_record:record",
    )
    batch = collect(cfg, [{"reward": 0.5}, {"fail": True}])
    # The agent makes no model call, so no group has rows to train on; the hooks are about rollouts.
    assert batch.metrics["rollouts_created"] == 4 and batch.metrics["failed_rollouts"] == 2
    good = [f"{cfg.run_id}.s0.i0.{k}" for k in range(2)]
    bad = [f"{cfg.run_id}.s0.i1.{k}" for k in range(2)]
    enqueued = notes.of("on_enqueue")
    assert sorted(n["rollout_id"] for n in enqueued) == sorted(good + bad)
    for note in enqueued:
        assert (note["where"], note["state"], note["attempt_id"], note["reward"]) == (
            "trainer",
            "queuing",
            None,
            None,
        )
        # The rollout as its creation answered: input, metadata, config.
        group_id = note["rollout_id"].rsplit(".", 1)[0]
        assert note["rollout"]["metadata"]["data_id"] == group_id
        assert note["rollout"]["input"] in ({"reward": 0.5}, {"fail": True})
    succeeded = notes.of("on_success")
    assert sorted((n["rollout_id"], n["state"], n["reward"]) for n in succeeded) == [
        (rid, "succeeded", 0.5) for rid in good
    ]
    assert {n["hook"] for n in succeeded} == {"record_async"}
    failed = notes.of("on_failure")
    # Failed rollouts are not read under failed_rollouts=drop: no reward is known.
    assert sorted((n["rollout_id"], n["state"], n["reward"]) for n in failed) == [
        (rid, "failed", None) for rid in bad
    ]
    assert all(n["rollout"]["rollout_id"] == n["rollout_id"] for n in succeeded + failed)


def test_a_raising_and_a_hanging_hook_are_logged_and_collecting_goes_on_meanwhile(
    gateway: Gateway, start_controller: StartController, notes: Notes
) -> None:
    start_controller(gateway)
    cfg = collector_config(
        gateway,
        hook_on_enqueue="hooks_record:hang",
        hook_on_success="hooks_record:explode",
        hook_timeout_s=1.0,
    )
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        batch = collect(cfg, [{"reward": 1.0}, {"reward": 0.0}])
    # Collecting finished (rollouts created, run, read) while four on_enqueue hooks slept 30 s.
    assert time.monotonic() - started < HANG_S
    assert batch.metrics["rollouts_created"] == 4 and "failed_rollouts" not in batch.metrics
    assert len(notes.of("on_enqueue")) == 4 and not [n for n in notes.read() if n["hook"] == "hang_returned"]
    assert len(notes.of("on_success")) == 4
    timed_out = [e for e in logs if e["event"].startswith("hook timed out")]
    failed = [e for e in logs if e["event"].startswith("hook failed")]
    assert [(e["hook"], e["point"], e["log_level"]) for e in timed_out] == [
        ("hooks_record:hang", "on_enqueue", "warning")
    ] * 4
    assert [(e["hook"], e["point"]) for e in failed] == [("hooks_record:explode", "on_success")] * 4
    assert all(isinstance(e["exc_info"], RuntimeError) for e in failed)


def test_a_train_hook_path_that_does_not_resolve_is_a_one_line_config_error(
    notes: Notes, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    base = {"dataset": "rows.jsonl", "model": "model", "agent_class": AGENT}
    with pytest.raises(ConfigError) as raised:
        TrainConfig.load({**base, "hook_on_success": "hooks_record:nothing_here"})
    assert str(raised.value) == (
        "invalid value 'hooks_record:nothing_here' for hook_on_success (from --hook-on-success): "
        "Value error, hook 'hooks_record:nothing_here': 'hooks_record' has no 'nothing_here'"
    )
    loaded = TrainConfig.load({**base, "hook_on_enqueue": "hooks_record:record", "hook_timeout_s": 3})
    settings = loaded.collector_config("http://127.0.0.1:1", "key")
    assert (settings.hook_on_enqueue, settings.hook_timeout_s) == ("hooks_record:record", 3.0)
    result = cli(
        "train", *(f"--{k.replace('_', '-')}={v}" for k, v in base.items()), "--hook-on-enqueue=nowhere:x"
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: invalid value 'nowhere:x' for hook_on_enqueue")
