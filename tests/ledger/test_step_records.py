"""Training runs' step records, as every `Ledger` backend keeps them for the dashboard's curves
(docs/protocol.md#training-runs): one record per (run, step), a repeated step replaces its record,
non-finite values come back as None, and a run's records page by step. A report may carry each
trained rollout's merge breaks: the last count reported per rollout is kept (and filtered on), an
unknown rollout is skipped, and a deleted rollout's count goes with it."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import asyncpg
import pytest

from keraunos.ledger import Ledger, SqliteLedger
from keraunos.ledger._rollout_query import RolloutQuery
from keraunos.ledger.codec import encode_json
from keraunos.ledger.postgres import PostgresLedger
from keraunos.ledger.postgres import _schema as pg_schema
from keraunos.ledger.postgres._pool import PoolSettings
from keraunos.ledger.sqlite import _schema as sqlite_schema
from keraunos.protocol import RolloutCreate

pytestmark = pytest.mark.anyio

#: The pool of a migrated PostgreSQL ledger: short limits, so a lost server fails fast.
PG_POOL = PoolSettings(max_size=2, connect_timeout_s=5.0, acquire_timeout_s=10.0)


def ids(page: object) -> list[str]:
    return [row.rollout_id for row in page.items]  # type: ignore[attr-defined]


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


# -- merge breaks per rollout ----------------------------------------------------------------------


async def breaks_of(ledger: Ledger) -> dict[str, int | None]:
    """Every rollout's reported merge-break count, as the dashboard's table reads it."""
    page = await ledger.page_rollouts(RolloutQuery(limit=100))
    return {row.rollout_id: row.merge_breaks for row in page.items}


async def test_a_report_with_rollouts_stores_each_ones_merge_breaks(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id=r, input={}) for r in ("a", "b", "c")], 1.0)
    await ledger.put_step_record("run-a", 0, {"rows/breaks": 2.0}, 2.0, merge_breaks={"a": 0, "b": 2})
    assert await breaks_of(ledger) == {"a": 0, "b": 2, "c": None}
    (record,) = await ledger.step_records("run-a", -1, 10)
    assert record.record == {"rows/breaks": 2.0}


async def test_a_rollout_reported_again_keeps_the_last_count(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id="a", input={})], 1.0)
    await ledger.put_step_record("run-a", 0, {}, 2.0, merge_breaks={"a": 3})
    await ledger.put_step_record("run-b", 4, {}, 3.0, merge_breaks={"a": 0})
    assert await breaks_of(ledger) == {"a": 0}
    await ledger.put_step_record("run-b", 5, {}, 4.0)  # a report without rollouts leaves it be
    assert await breaks_of(ledger) == {"a": 0}


async def test_a_rollout_that_does_not_exist_is_skipped_and_the_rest_is_stored(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id="a", input={})], 1.0)
    await ledger.put_step_record("run-a", 0, {"rows/breaks": 1.0}, 2.0, merge_breaks={"gone": 4, "a": 1})
    assert await breaks_of(ledger) == {"a": 1}
    assert [r.step for r in await ledger.step_records("run-a", -1, 10)] == [0]


async def test_a_deleted_rollouts_count_goes_with_it(ledger: Ledger) -> None:
    await ledger.create_rollouts([RolloutCreate(rollout_id="a", input={})], 1.0)
    await ledger.put_step_record("run-a", 0, {}, 2.0, merge_breaks={"a": 2})
    await ledger.delete_rollout("a")
    # A rollout created again under the id is a new rollout: nothing was reported of it.
    await ledger.create_rollouts([RolloutCreate(rollout_id="a", input={})], 3.0)
    assert await breaks_of(ledger) == {"a": None}
    assert (await ledger.page_rollouts(RolloutQuery(merge_break=True))).total == 0


# -- schema upgrades -------------------------------------------------------------------------------


async def test_a_sqlite_file_at_step_11_keeps_its_rollouts_and_takes_their_merge_breaks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in enumerate(sqlite_schema.MIGRATIONS[:11], start=1):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
    conn.execute(
        "INSERT INTO rollouts (rollout_id, state, is_train, input, config, metadata, data_id, version, "
        "created_at, updated_at) VALUES ('old', 'queuing', 1, ?1, ?1, ?1, '', 1, 1, 1)",
        (encode_json({}),),
    )
    conn.close()
    async with SqliteLedger(path) as ledger:
        await ledger.put_step_record("run-a", 0, {}, 2.0, merge_breaks={"old": 1})
        assert ids(await ledger.page_rollouts(RolloutQuery(merge_break=True))) == ["old"]


async def test_a_postgres_database_at_step_10_keeps_its_rollouts_and_takes_their_merge_breaks(
    postgres_dsn: str,
) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(pg_schema._CREATE_VERSION_TABLE)
        for script in pg_schema.MIGRATIONS[:10]:
            await conn.execute(script)
        await conn.execute("UPDATE keraunos_schema SET version = 10")
        await conn.execute(
            "INSERT INTO rollouts (rollout_id, state, is_train, input, config, metadata, data_id, "
            "version, created_at, updated_at) VALUES ('old', 'queuing', true, $1, $1, $1, '', 1, 1, 1)",
            encode_json({}),
        )
    finally:
        await conn.close()
    async with PostgresLedger(postgres_dsn, pool=PG_POOL) as ledger:
        await ledger.put_step_record("run-a", 0, {}, 2.0, merge_breaks={"old": 1})
        assert ids(await ledger.page_rollouts(RolloutQuery(merge_break=True))) == ["old"]
