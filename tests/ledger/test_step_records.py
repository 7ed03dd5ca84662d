"""Training runs' step records, as every `Ledger` backend keeps them for the dashboard's curves
(docs/protocol.md#training-runs): one record per (run, step), a repeated step replaces its record,
non-finite values come back as None, and a run's records page by step."""

from __future__ import annotations

import math

import pytest

from keraunos.ledger import Ledger

pytestmark = pytest.mark.anyio


async def test_records_come_back_in_step_order_and_page_by_step(ledger: Ledger) -> None:
    for step in (2, 0, 1):
        await ledger.put_step_record(
            "run-a", step, {"step": float(step), "reward_mean": step / 10}, 10.0 + step
        )
    records = await ledger.step_records("run-a", -1, 100)
    assert [r.step for r in records] == [0, 1, 2]
    assert records[1].record == {"step": 1.0, "reward_mean": 0.1}
    assert [r.step for r in await ledger.step_records("run-a", 0, 1)] == [1]
    assert await ledger.step_records("unknown", -1, 100) == []


async def test_a_step_reported_again_replaces_its_record(ledger: Ledger) -> None:
    await ledger.put_step_record("run-a", 0, {"reward_mean": 0.1}, 1.0)
    await ledger.put_step_record("run-a", 0, {"reward_mean": 0.7, "train/kl": math.nan}, 2.0)
    (record,) = await ledger.step_records("run-a", -1, 100)
    assert (record.at, record.record) == (2.0, {"reward_mean": 0.7, "train/kl": None})


async def test_runs_most_recent_first(ledger: Ledger) -> None:
    await ledger.put_step_record("old", 0, {}, 1.0)
    await ledger.put_step_record("new", 0, {}, 2.0)
    await ledger.put_step_record("new", 1, {}, 3.0)
    runs = await ledger.list_runs(10)
    assert [(r.run_id, r.steps, r.last_step, r.first_at, r.last_at) for r in runs] == [
        ("new", 2, 1, 2.0, 3.0),
        ("old", 1, 0, 1.0, 1.0),
    ]
